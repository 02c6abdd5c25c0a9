//! `berth-bench controllers`: a Deployment of `--replicas` pods against `--nodes` Node objects
//! (no agents; the pods are bound by the scheduler in the server), next to the raw API create
//! rate of the same pods measured in the same run.
//!
//! The bench starts the release `berth server` (SQLite in a temp dir of this run) with its
//! scheduler and controllers in process, `--leader-elect=false` and
//! `--controllers=*,-nodelifecycle`: no agent renews the Nodes' Leases, and the node lifecycle
//! controller would find them unreachable after its grace period (50 s) and taint them. It
//! creates the Nodes as an agent registers them (allocatable cpu 32, memory 128Gi, pods 110,
//! runtime handlers, Ready), the RuntimeClasses and two namespaces, then:
//!
//! 1. **raw creates**: `--replicas` pods of the Deployment's pod template, created by the bench
//!    from `--clients` concurrent clients in namespace `bench-raw` with a `schedulerName` no
//!    scheduler answers to (they stay unbound), then deleted again. Pods per second is the API's
//!    create rate the controllers are held against.
//! 2. **Deployment**: with a watch of namespace `bench` open, the bench creates one Deployment of
//!    `--replicas` replicas and times, from the create call, when each pod is first seen and when
//!    it is first seen bound (`spec.nodeName` set): pods created per second (all pods existing),
//!    time to all bound, and created/s ÷ raw creates/s. Where the pods arrive in clusters (gaps of
//!    at least `--batch-gap-ms` between consecutive pods), those clusters are printed as the
//!    ReplicaSet's observed slow-start batches, next to what `slowStartBatch` with
//!    burstReplicas 500 would make.
//!
//! Figures are printed (and written as JSON with `--json`), never asserted. The server is stopped
//! and the run directory removed unless `--keep-dir`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use futures::TryStreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};

use crate::agent::cluster;
use crate::scheduler::objects;
use crate::stats::{Figure, Latencies};

const NAMESPACE: &str = "bench";
const RAW_NAMESPACE: &str = "bench-raw";
const DEPLOYMENT: &str = "bench-app";
/// No scheduler answers to this name: the raw pods stay unbound.
const RAW_SCHEDULER: &str = "berth-bench-none";
/// Created/s of the Deployment ÷ raw creates/s, at least.
const RATIO_TARGET: f64 = 0.5;
/// kube-controller-manager's default client rate limit (`--kube-api-qps`), requests/s.
const KCM_QPS: f64 = 20.0;
/// How long the pod and bound counts may stand still before the run fails.
const STALL: Duration = Duration::from_secs(60);
/// The ReplicaSet controller's `burstReplicas`.
const BURST_REPLICAS: usize = 500;

#[derive(clap::Args)]
pub struct ControllersArgs {
    /// Replicas of the Deployment (and raw pods created).
    #[arg(long, default_value_t = 1000)]
    replicas: usize,
    /// Node objects (no agents).
    #[arg(long, default_value_t = 50)]
    nodes: usize,
    /// Concurrent clients of the raw creates (and the node creates).
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// A gap between consecutive new pods of at least this many ms starts an observed batch.
    #[arg(long, default_value_t = 3.0)]
    batch_gap_ms: f64,
    /// Keep the run directory (the server's log) instead of removing it.
    #[arg(long)]
    keep_dir: bool,
    /// The `berth` binary; default: next to this binary.
    #[arg(long)]
    berth_binary: Option<PathBuf>,
    /// Also write the figures here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub async fn run(args: ControllersArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    ensure!(
        args.replicas > 0 && args.nodes > 0 && args.clients > 0,
        "--replicas, --nodes and --clients must be positive"
    );
    let room = (0..args.nodes).filter(|&n| objects::fits(n, "runc")).count() * objects::NODE_PODS;
    ensure!(args.replicas <= room, "{} replicas exceed the {room} pod slots of {} nodes", args.replicas, args.nodes);
    let binary = crate::scheduler::controllers_binary(args.berth_binary.as_deref())?;
    let dir = tempfile::Builder::new().prefix("berth-bench-controllers.").tempdir()?;
    eprintln!("run directory {}", dir.path().display());
    let result = measure(&args, &binary, dir.path()).await;
    if args.keep_dir {
        let kept = dir.keep();
        eprintln!("run directory kept: {}", kept.display());
    }
    let report = result?;
    report.print();
    crate::finish_run(args.json.as_deref(), || report.to_json(), started)
}

/// The Deployment's pod template (and, with a name, the raw pods): requests and RuntimeClass
/// `runc` as the scheduler bench's pods.
fn pod_spec(scheduler_name: Option<&str>) -> Value {
    let mut spec = json!({
        "runtimeClassName": "runc",
        "containers": [{
            "name": "app",
            "image": "registry.example/berth-bench/app:1.0",
            "resources": {"requests": {"cpu": objects::POD_CPU, "memory": objects::POD_MEMORY}},
        }],
    });
    if let Some(name) = scheduler_name {
        spec["schedulerName"] = json!(name);
    }
    spec
}

fn labels() -> Value {
    json!({"app": "berth-bench-controllers"})
}

fn raw_pod(i: usize) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("raw-{i:05}"), "labels": labels()},
        "spec": pod_spec(Some(RAW_SCHEDULER)),
    }))?)
}

fn deployment(replicas: usize) -> anyhow::Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": DEPLOYMENT},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels()},
            "template": {"metadata": {"labels": labels()}, "spec": pod_spec(None)},
        },
    }))?)
}

async fn measure(args: &ControllersArgs, binary: &Path, root: &Path) -> anyhow::Result<Report> {
    eprintln!(
        "berth server --leader-elect=false --controllers=*,-nodelifecycle (scheduler and controllers in process)"
    );
    let extra = ["--leader-elect=false", "--controllers=*,-nodelifecycle"];
    let (server, admin, data_dir) = cluster::start_server_with(binary, root, &extra).await?;
    let kubeconfig = data_dir.join("admin.kubeconfig");
    let mut clients = Vec::new();
    for _ in 0..args.clients {
        clients.push(cluster::client(&kubeconfig).await?);
    }
    for ns in [NAMESPACE, RAW_NAMESPACE] {
        let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        Api::<Namespace>::all(admin.clone())
            .create(&PostParams::default(), &obj)
            .await
            .with_context(|| format!("creating namespace {ns}"))?;
        cluster::wait_for_service_account(&admin, ns).await?;
    }
    for class in objects::runtime_classes() {
        Api::<RuntimeClass>::all(admin.clone()).create(&PostParams::default(), &class).await?;
    }

    let create_node = |client: kube::Client, i: usize| async move {
        Api::<Node>::all(client)
            .create(&PostParams::default(), &objects::node(i))
            .await
            .with_context(|| format!("creating node {i}"))?;
        anyhow::Ok(())
    };
    let (_, took) = crate::scheduler::in_parallel(&clients, args.clients, 0..args.nodes, create_node).await?;
    let last = Api::<Node>::all(admin.clone()).get(&objects::node_name(args.nodes - 1)).await?;
    ensure!(objects::status_kept(&last), "the server dropped the status of node {}", args.nodes - 1);
    eprintln!("  {} nodes created in {:.1} s (status kept from the create)", args.nodes, took.as_secs_f64());

    eprintln!("raw: {} pods created from {} clients in {RAW_NAMESPACE} (unbound)", args.replicas, args.clients);
    let create_raw = |client: kube::Client, i: usize| async move {
        Api::<Pod>::namespaced(client, RAW_NAMESPACE)
            .create(&PostParams::default(), &raw_pod(i)?)
            .await
            .with_context(|| format!("creating raw pod {i}"))?;
        anyhow::Ok(())
    };
    let (raw_lat, raw_wall) =
        crate::scheduler::in_parallel(&clients, args.clients, 0..args.replicas, create_raw).await?;
    eprintln!("  {:.0} pods/s", args.replicas as f64 / raw_wall.as_secs_f64());
    delete_pods(&admin, RAW_NAMESPACE).await?;

    eprintln!("Deployment {DEPLOYMENT}: {} replicas", args.replicas);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let watch = watch_pods(Api::namespaced(admin.clone(), NAMESPACE), seen.clone()).await?;
    let origin = Instant::now();
    Api::<Deployment>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &deployment(args.replicas)?)
        .await
        .context("creating the Deployment")?;
    let (mut last_counts, mut last_change) = ((0, 0), Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let counts = {
            let s = seen.lock().unwrap();
            (s.created.len(), s.bound.len())
        };
        if counts.0 >= args.replicas && counts.1 >= args.replicas {
            break;
        }
        ensure!(cluster::alive(server.pid), "berth server exited:\n{}", server.log_tail());
        if watch.is_finished() {
            match watch.await {
                Ok(Err(e)) => return Err(e.context("the bench's watch of the pods failed")),
                Ok(Ok(())) => bail!("the bench's watch of the pods ended early"),
                Err(e) => bail!("the bench's watch of the pods panicked: {e}"),
            }
        }
        if counts != last_counts {
            (last_counts, last_change) = (counts, Instant::now());
        } else if last_change.elapsed() > STALL {
            bail!("{} pods created, {} bound of {}, no change for {STALL:?}", counts.0, counts.1, args.replicas);
        }
    }
    watch.abort();
    let seen = std::mem::take(&mut *seen.lock().unwrap());

    let pods = Api::<Pod>::namespaced(admin.clone(), NAMESPACE).list(&ListParams::default()).await?;
    let bound =
        pods.items.iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some_and(|n| !n.is_empty()));
    let (listed, bound) = (pods.items.len(), bound.count());
    ensure!(
        listed == args.replicas && bound == args.replicas,
        "{listed} pods listed, {bound} bound, not {}",
        args.replicas
    );
    drop(server);

    let mut created: Vec<Duration> = seen.created.values().map(|t| t.saturating_duration_since(origin)).collect();
    created.sort();
    let mut bound: Vec<Duration> = seen.bound.values().map(|t| t.saturating_duration_since(origin)).collect();
    bound.sort();
    let mut create_to_bound = Latencies::default();
    for (name, b) in &seen.bound {
        if let Some(c) = seen.created.get(name) {
            create_to_bound.record(b.saturating_duration_since(*c));
        }
    }
    let gap = Duration::from_secs_f64(args.batch_gap_ms / 1000.0);
    let report = Report {
        replicas: args.replicas,
        nodes: args.nodes,
        clients: args.clients,
        raw_lat,
        raw_wall,
        observed_batches: clusters(&created, gap),
        batch_gap: gap,
        created,
        bound,
        create_to_bound,
    };
    eprintln!("  {}", report.summary());
    Ok(report)
}

/// When the bench's watch first saw each pod, and first saw it bound.
#[derive(Default)]
struct Seen {
    created: HashMap<String, Instant>,
    bound: HashMap<String, Instant>,
}

/// Watches the pods of `api` from now on, restarting where it left off when the server ends it.
async fn watch_pods(
    api: Api<Pod>,
    seen: Arc<Mutex<Seen>>,
) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<()>>> {
    let mut rv = api.list(&ListParams::default().limit(1)).await?.metadata.resource_version.unwrap_or_default();
    Ok(tokio::spawn(async move {
        loop {
            let events = api.watch(&WatchParams::default().timeout(290), &rv).await.context("watching pods")?;
            futures::pin_mut!(events);
            while let Some(event) = events.try_next().await? {
                let pod = match event {
                    WatchEvent::Added(pod) | WatchEvent::Modified(pod) => pod,
                    WatchEvent::Deleted(_) => continue,
                    WatchEvent::Bookmark(b) => {
                        rv = b.metadata.resource_version;
                        continue;
                    }
                    WatchEvent::Error(e) => bail!("watch error: {} ({})", e.message, e.code),
                };
                let at = Instant::now();
                if let Some(v) = &pod.metadata.resource_version {
                    rv.clone_from(v);
                }
                let Some(name) = pod.metadata.name else { continue };
                let on_node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
                let mut s = seen.lock().unwrap();
                s.created.entry(name.clone()).or_insert(at);
                if on_node {
                    s.bound.entry(name).or_insert(at);
                }
            }
        }
    }))
}

/// Deletes every pod of `namespace` at once (grace period 0) and waits until none is left.
async fn delete_pods(admin: &kube::Client, namespace: &str) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(admin.clone(), namespace);
    let started = Instant::now();
    api.delete_collection(&DeleteParams::default().grace_period(0), &ListParams::default())
        .await
        .with_context(|| format!("deleting the pods of {namespace}"))?;
    while !api.list(&ListParams::default().limit(1)).await?.items.is_empty() {
        ensure!(started.elapsed() < Duration::from_secs(120), "pods of {namespace} still there after 120 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("  deleted the pods of {namespace} in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Sizes of the runs of sorted `times` whose consecutive members are less than `gap` apart.
fn clusters(times: &[Duration], gap: Duration) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    let mut prev: Option<Duration> = None;
    for &t in times {
        match (prev, out.last_mut()) {
            (Some(p), Some(last)) if t - p < gap => *last += 1,
            _ => out.push(1),
        }
        prev = Some(t);
    }
    out
}

/// The batches kube-controller-manager's ReplicaSet controller would create `replicas` pods in:
/// syncs of at most burstReplicas, each in slow-start batches 1, 2, 4, …
fn expected_batches(replicas: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut left = replicas;
    while left > 0 {
        let sync = left.min(BURST_REPLICAS);
        let (mut remaining, mut batch) = (sync, 1.min(sync));
        while batch > 0 {
            out.push(batch);
            remaining -= batch;
            batch = (2 * batch).min(remaining);
        }
        left -= sync;
    }
    out
}

struct Report {
    replicas: usize,
    nodes: usize,
    clients: usize,
    raw_lat: Latencies,
    raw_wall: Duration,
    /// From the Deployment's create call: when each pod was first seen, and seen bound (sorted).
    created: Vec<Duration>,
    bound: Vec<Duration>,
    create_to_bound: Latencies,
    observed_batches: Vec<usize>,
    batch_gap: Duration,
}

fn secs(d: Option<&Duration>) -> Option<f64> {
    d.map(Duration::as_secs_f64)
}

impl Report {
    fn raw_rate(&self) -> f64 {
        self.replicas as f64 / self.raw_wall.as_secs_f64()
    }

    /// Deployment created → all pods seen.
    fn all_created(&self) -> Option<f64> {
        secs(self.created.last())
    }

    fn all_bound(&self) -> Option<f64> {
        secs(self.bound.last())
    }

    fn created_rate(&self) -> Option<f64> {
        self.all_created().map(|s| self.replicas as f64 / s)
    }

    /// First pod seen → last pod seen: the controllers' create rate without their reaction time.
    fn created_window_rate(&self) -> Option<f64> {
        let (first, last) = (self.created.first()?, self.created.last()?);
        Some(self.replicas.saturating_sub(1) as f64 / (*last - *first).as_secs_f64())
    }

    fn bound_rate(&self) -> Option<f64> {
        self.all_bound().map(|s| self.replicas as f64 / s)
    }

    fn ratio(&self) -> Option<f64> {
        self.created_rate().map(|r| r / self.raw_rate())
    }

    fn summary(&self) -> String {
        format!(
            "{} pods created in {} s ({} pods/s), all bound at {} s; raw creates {:.0} pods/s; ratio {}",
            self.replicas,
            cell(self.all_created(), 2),
            cell(self.created_rate(), 0),
            cell(self.all_bound(), 2),
            self.raw_rate(),
            cell(self.ratio(), 2)
        )
    }

    fn print(&self) {
        println!();
        println!(
            "berth-bench controllers: Deployment of {} replicas, {} Node objects (no agents), raw creates from {} clients",
            self.replicas, self.nodes, self.clients
        );
        println!();
        let raw = Figure::new("", "", &self.raw_lat, None);
        println!(
            "raw API creates (bench, {} clients):   {:>7.0} pods/s   ({:.2} s; create p50 {} ms, p99 {} ms)",
            self.clients,
            self.raw_rate(),
            self.raw_wall.as_secs_f64(),
            cell(raw.p50_ms, 1),
            cell(raw.p99_ms, 1)
        );
        println!(
            "Deployment → all {} pods created:   {:>7} pods/s   ({} s; first pod at {} s; first → last {} pods/s)",
            self.replicas,
            cell(self.created_rate(), 0),
            cell(self.all_created(), 2),
            cell(secs(self.created.first()), 3),
            cell(self.created_window_rate(), 0)
        );
        let c2b = Figure::new("", "", &self.create_to_bound, None);
        println!(
            "Deployment → all {} pods bound:     {:>7} pods/s   ({} s; pod seen → bound p50 {} ms, p99 {} ms)",
            self.replicas,
            cell(self.bound_rate(), 0),
            cell(self.all_bound(), 2),
            cell(c2b.p50_ms, 1),
            cell(c2b.p99_ms, 1)
        );
        println!(
            "pod arrivals at the watch, clustered at gaps ≥ {:.1} ms (≈ create batches): {:?}",
            self.batch_gap.as_secs_f64() * 1000.0,
            self.observed_batches
        );
        println!(
            "kube-controller-manager slowStartBatch, burstReplicas {BURST_REPLICAS}: {:?}",
            expected_batches(self.replicas)
        );
        println!(
            "(kube-controller-manager's default client limit, {KCM_QPS:.0} requests/s, would take ≥ {:.0} s for the creates alone)",
            self.replicas as f64 / KCM_QPS
        );
        println!();
        let ok = self.ratio().map(|r| r >= RATIO_TARGET);
        println!(
            "created/s ÷ raw creates/s = {}, target ≥ {RATIO_TARGET:.2}: {}",
            cell(self.ratio(), 2),
            match ok {
                Some(true) => "met",
                Some(false) => "NOT met",
                None => "n/a",
            }
        );
    }

    fn to_json(&self) -> Value {
        let (raw, c2b) = (Figure::new("", "", &self.raw_lat, None), Figure::new("", "", &self.create_to_bound, None));
        json!({
            "replicas": self.replicas,
            "nodes": self.nodes,
            "clients": self.clients,
            "raw": {
                "creates_per_sec": self.raw_rate(),
                "wall_s": self.raw_wall.as_secs_f64(),
                "create_p50_ms": raw.p50_ms,
                "create_p99_ms": raw.p99_ms,
            },
            "deployment": {
                "first_created_s": secs(self.created.first()),
                "all_created_s": self.all_created(),
                "created_per_sec": self.created_rate(),
                "created_first_to_last_per_sec": self.created_window_rate(),
                "all_bound_s": self.all_bound(),
                "bound_per_sec": self.bound_rate(),
                "seen_to_bound_p50_ms": c2b.p50_ms,
                "seen_to_bound_p99_ms": c2b.p99_ms,
                "observed_batches": self.observed_batches,
                "batch_gap_ms": self.batch_gap.as_secs_f64() * 1000.0,
                "expected_batches": expected_batches(self.replicas),
            },
            "created_vs_raw": self.ratio(),
            "created_vs_raw_target": RATIO_TARGET,
        })
    }
}

fn cell(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.decimals$}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_batches_follow_slow_start_per_burst() {
        let b = expected_batches(1000);
        assert_eq!(&b[..9], &[1, 2, 4, 8, 16, 32, 64, 128, 245]);
        assert_eq!(b.iter().sum::<usize>(), 1000);
        assert_eq!(b.len(), 18);
        assert_eq!(expected_batches(3), vec![1, 2]);
    }

    #[test]
    fn arrivals_split_at_gaps() {
        let ms = |v: &[u64]| v.iter().map(|&m| Duration::from_millis(m)).collect::<Vec<_>>();
        assert_eq!(clusters(&ms(&[0, 10, 11, 12, 30, 31]), Duration::from_millis(5)), vec![1, 3, 2]);
        assert!(clusters(&[], Duration::from_millis(5)).is_empty());
    }

    #[test]
    fn the_template_parses() {
        let d = deployment(10).unwrap();
        assert_eq!(d.spec.unwrap().replicas, Some(10));
        assert_eq!(raw_pod(3).unwrap().spec.unwrap().scheduler_name.as_deref(), Some(RAW_SCHEDULER));
    }
}
