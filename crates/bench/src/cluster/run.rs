//! One run of the cluster bench: its server (and etcd), the hollow nodes, the Deployments, the
//! observers, and the teardown of all of them.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::calls::ApiCalls;
use super::hollow::{self, Fleet, Workers};
use super::observe::{self, Listing, PodWatch};
use super::result::{LogSummary, Outcome, RunResult};
use super::{ClusterArgs, Plan, Store, paced_replicas, usage};
use crate::agent::cluster;
use crate::etcd_server::EtcdServer;
use crate::scheduler::objects;

const NAMESPACE: &str = "bench";
const APP_LABEL: &str = "berth-bench-cluster";
/// How long the hollow nodes' registration and watches may take, beyond the deadline check.
const REGISTER_PATIENCE: Duration = Duration::from_secs(600);
/// How long one list of all pods may take before it is given up.
const LIST_PATIENCE: Duration = Duration::from_secs(120);
/// How often a paced run scales its Deployments up.
const SCALE_STEP: Duration = Duration::from_millis(500);
/// How often the run's progress is looked at.
const POLL: Duration = Duration::from_millis(200);

/// Raises this process's open-file limit to its hard limit (the server, its child, inherits it):
/// every hollow node's watch holds a connection on both sides.
pub fn raise_open_files(nodes: usize) -> anyhow::Result<()> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).context("reading RLIMIT_NOFILE")?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).context("raising RLIMIT_NOFILE")?;
    }
    let needed = nodes as u64 + 2048;
    ensure!(hard >= needed, "{nodes} hollow nodes need about {needed} open files; the hard limit is {hard}");
    Ok(())
}

/// The Deployment of `replicas` pods of RuntimeClass `class`.
fn deployment(class: &str, replicas: usize) -> anyhow::Result<Deployment> {
    let labels = json!({"app": APP_LABEL, "class": class});
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("hollow-{class}")},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "runtimeClassName": class,
                    "containers": [{
                        "name": "app",
                        "image": "registry.example/berth-bench/app:1.0",
                        "resources": {"requests": {"cpu": objects::POD_CPU, "memory": objects::POD_MEMORY}},
                    }],
                },
            },
        },
    }))?)
}

/// One run; failures after the server is up end the run with what was measured so far.
pub async fn one(
    args: &ClusterArgs,
    binary: &Path,
    root: &Path,
    plan: Plan,
    deadline: Instant,
    stop: &AtomicBool,
) -> RunResult {
    let mut result = RunResult::new(plan);
    let dir = root.join(format!("{}-{}", plan.store.name(), plan.nodes));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        result.outcome = Outcome::Failed(format!("creating {}: {e}", dir.display()));
        return result;
    }
    let etcd = match plan.store {
        Store::Etcd => match EtcdServer::start(&args.etcd_binary).await {
            Ok(etcd) => Some(etcd),
            Err(e) => {
                result.outcome = Outcome::Failed(format!("starting etcd: {e:#}"));
                return result;
            }
        },
        Store::Sqlite => None,
    };
    let mut extra: Vec<String> = [
        "--leader-elect=false",
        // Room for a /24 per node at 5,000 nodes and more (the default /16 has 256), in the
        // range the hollow nodes' pod addresses come from.
        "--cluster-cidr=10.128.0.0/9",
        // Not what is measured; and port 10053 may be taken by another server on the machine.
        "--cluster-dns-port=0",
        // Compaction as a production server runs it: a long run's history would otherwise grow
        // the store (and etcd's memory) without bound.
        "--compaction-interval-seconds=300",
    ]
    .map(str::to_owned)
    .to_vec();
    if let Some(etcd) = &etcd {
        extra.push(format!("--etcd-servers={}", etcd.endpoint));
    }
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let (server, admin, data_dir) = match cluster::start_server_with(binary, &dir, &extra).await {
        Ok(s) => s,
        Err(e) => {
            result.outcome = Outcome::Failed(format!("starting the server: {e:#}"));
            return result;
        }
    };
    let mut pids = vec![server.pid, std::process::id()];
    pids.extend(etcd.as_ref().and_then(EtcdServer::pid));
    result.processes = ["server", "bench", "etcd"][..pids.len()].iter().map(|s| (*s).to_owned()).collect();
    let origin = Instant::now();
    let (samples, sampler) = usage::sample(pids, origin);
    let limits = Limits { deadline, stop };
    if let Err(e) = measure(args, &data_dir, &admin, &server, plan, limits, &mut result).await {
        result.outcome = Outcome::Failed(format!("{e:#}"));
    }
    sampler.abort();
    result.samples = std::mem::take(&mut *samples.lock().unwrap());
    result.server_log = LogSummary::read(&server.log);
    drop(server);
    drop(etcd);
    result
}

async fn measure(
    args: &ClusterArgs,
    data_dir: &Path,
    admin: &kube::Client,
    server: &crate::cri::daemons::Daemon,
    plan: Plan,
    limits: Limits<'_>,
    result: &mut RunResult,
) -> anyhow::Result<()> {
    let deadline = limits.deadline;
    let kubeconfig = data_dir.join("admin.kubeconfig");
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?;
    Api::<Namespace>::all(admin.clone()).create(&PostParams::default(), &ns).await.context("creating the namespace")?;
    cluster::wait_for_service_account(admin, NAMESPACE).await?;
    for class in objects::runtime_classes() {
        Api::<RuntimeClass>::all(admin.clone()).create(&PostParams::default(), &class).await?;
    }

    let calls = Arc::new(ApiCalls::default());
    let workers = Workers { status: args.status_workers, heartbeat: args.heartbeat_workers };
    let fleet = Fleet::new(cluster::client(&kubeconfig).await?, calls.clone(), plan.nodes, workers);
    let observer = cluster::client(&kubeconfig).await?;
    let registering = Instant::now();
    // Each node goes live (heartbeats, its watch) as soon as it is registered: the watches'
    // connections open at the pace of the registrations, not all at once.
    let register = futures::stream::iter(0..plan.nodes)
        .map(|i| {
            let fleet = fleet.clone();
            async move {
                let lease = hollow::register(&fleet, i).await.with_context(|| format!("registering node {i}"))?;
                anyhow::Ok(tokio::spawn(hollow::live(fleet, i, lease)))
            }
        })
        .buffered(args.register_concurrency)
        .collect::<Vec<_>>();
    let registered = tokio::select! {
        r = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), register) => {
            r.context("--timeout reached while registering the hollow nodes")?
        }
        () = limits.stopped() => anyhow::bail!("interrupted while registering the hollow nodes"),
    };
    let mut nodes = AbortOnDrop(Vec::with_capacity(plan.nodes));
    let mut failed = None;
    for r in registered {
        match r {
            Ok(task) => nodes.0.push(task),
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    let patience = (Instant::now() + REGISTER_PATIENCE).min(deadline);
    while fleet.watching.load(std::sync::atomic::Ordering::SeqCst) < plan.nodes {
        ensure!(cluster::alive(server.pid), "berth server exited:\n{}", server.log_tail());
        ensure!(Instant::now() < patience, "the hollow nodes' watches were not all open in time");
        ensure!(!limits.is_stopped(), "interrupted while the hollow nodes' watches opened");
        tokio::time::sleep(POLL).await;
    }
    result.registered = Some(registering.elapsed());
    eprintln!("  {} hollow nodes registered and watching in {:.1} s", plan.nodes, registering.elapsed().as_secs_f64());

    let watch = PodWatch::start(observer.clone(), NAMESPACE);
    while !watch.ready() {
        ensure!(Instant::now() < patience, "the bench's watch of the pods did not open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gets = AbortOnDrop(vec![observe::sample_gets(observer.clone(), NAMESPACE, watch.times.clone(), calls.clone())]);
    let origin = Instant::now();
    result.deployments_at = Some(origin);
    let deployments = Api::<Deployment>::namespaced(admin.clone(), NAMESPACE);
    let first = paced_replicas(plan.pods, args.create_rate, Duration::ZERO);
    for ((class, _), n) in objects::CLASSES.iter().zip(first.iter().copied()) {
        deployments
            .create(&PostParams::default(), &deployment(class, n)?)
            .await
            .with_context(|| format!("creating the Deployment of {class}"))?;
    }
    let scaling = AbortOnDrop(vec![tokio::spawn(scale_up(deployments, plan.pods, args.create_rate, origin, first))]);

    let mut during: Option<tokio::task::JoinHandle<Listing>> = None;
    let (mut last, mut last_change) = ((0, 0, 0), Instant::now());
    let mut next_progress = Instant::now() + Duration::from_secs(10);
    result.outcome = loop {
        tokio::time::sleep(POLL).await;
        let counts = watch.counts();
        if counts.2 >= plan.pods {
            result.all_running = Some(origin.elapsed());
            break Outcome::Complete;
        }
        if !cluster::alive(server.pid) {
            break Outcome::Failed(format!("berth server exited:\n{}", server.log_tail()));
        }
        if Instant::now() > deadline {
            break Outcome::TimedOut;
        }
        if limits.is_stopped() {
            break Outcome::Interrupted;
        }
        if counts != last {
            (last, last_change) = (counts, Instant::now());
        } else if last_change.elapsed() > Duration::from_secs(args.stall_secs) {
            break Outcome::Stalled(last_change.duration_since(origin));
        }
        if during.is_none() && counts.2 * 2 >= plan.pods {
            let (client, calls) = (observer.clone(), calls.clone());
            during = Some(tokio::spawn(async move { timed_list(&client, &calls, origin).await }));
        }
        if Instant::now() > next_progress {
            next_progress += Duration::from_secs(10);
            eprintln!(
                "  {:>4.0} s: {} pods seen, {} bound, {} running",
                origin.elapsed().as_secs_f64(),
                counts.0,
                counts.1,
                counts.2
            );
        }
    };
    eprintln!("  {:?} at {:.1} s", result.outcome, origin.elapsed().as_secs_f64());
    if let Some(task) = during {
        result.listings.extend(task.await.ok());
    }
    if cluster::alive(server.pid) && !limits.is_stopped() {
        for _ in 0..2 {
            result.listings.push(timed_list(&observer, &calls, origin).await);
        }
        let hold = Duration::from_secs(args.hold_secs).min(deadline.saturating_duration_since(Instant::now()));
        tokio::select! {
            () = tokio::time::sleep(hold) => {}
            () = limits.stopped() => {}
        }
    }
    drop((gets, scaling));
    result.observer_errors = watch.errors();
    result.times = Some(watch.stop());
    result.calls = calls.take();
    result.watch_errors = fleet.watch_errors.load(std::sync::atomic::Ordering::Relaxed);
    result.patches_given_up = fleet.patches_given_up.load(std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// Scales the Deployments up to `pods` replicas in all at `rate` pods per second, from the
/// replicas they were created with; a failed patch is tried again at the next step.
async fn scale_up(deployments: Api<Deployment>, pods: usize, rate: f64, origin: Instant, mut have: Vec<usize>) {
    let mut step = tokio::time::interval(SCALE_STEP);
    step.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while have.iter().sum::<usize>() < pods {
        step.tick().await;
        let want = paced_replicas(pods, rate, origin.elapsed());
        for (((class, _), want), have) in objects::CLASSES.iter().zip(want).zip(have.iter_mut()) {
            if want <= *have {
                continue;
            }
            let patch = json!({"spec": {"replicas": want}});
            let name = format!("hollow-{class}");
            match deployments.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => *have = want,
                Err(e) => eprintln!("  scaling {name} to {want}: {e}"),
            }
        }
    }
}

async fn timed_list(client: &kube::Client, calls: &ApiCalls, origin: Instant) -> Listing {
    let at = origin.elapsed();
    match tokio::time::timeout(LIST_PATIENCE, observe::list_all_pods(client, calls, origin)).await {
        Ok(listing) => listing,
        Err(_) => Listing {
            at,
            took: LIST_PATIENCE,
            pods: None,
            bytes: 0,
            error: Some(format!("no answer in {LIST_PATIENCE:?}")),
        },
    }
}

/// When a run must end early.
#[derive(Clone, Copy)]
struct Limits<'a> {
    deadline: Instant,
    stop: &'a AtomicBool,
}

impl Limits<'_> {
    fn is_stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Returns once the stop flag is raised.
    async fn stopped(&self) {
        while !self.is_stopped() {
            tokio::time::sleep(POLL).await;
        }
    }
}

/// Tasks aborted when this is dropped, however the run ends.
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}
