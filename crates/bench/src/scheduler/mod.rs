//! `berth-bench scheduler`: pods scheduled per second end to end (create → bound, scheduler_perf's
//! SchedulingThroughput) on thousands of fake Nodes, next to the server's raw binding-write rate
//! measured in the same run, and the scheduler's resident memory.
//!
//! The bench starts the release `berth server` (SQLite in a temp dir of this run) with
//! `--no-scheduler` (and `--controllers=-*` where the server runs controllers: nothing is to
//! find the agentless nodes unreachable, nor collect pods of the fake ReplicaSets), creates the Nodes (labels, zones, taints, allocatable and
//! `status.runtimeHandlers` in three mixes, Ready; no agent runs, and nothing marks them
//! NotReady), the three RuntimeClasses and a namespace, and then, for case 1:
//!
//! 1. **floor**: with no scheduler running, creates as many pods as the case has, then binds each
//!    through `pods/binding` straight from the bench, 64 in flight as the scheduler writes them,
//!    and deletes them again. Binds per second is the floor the scheduler is held against.
//! 2. **created while scheduling**: starts `berth scheduler --leader-elect=false` as a process of
//!    its own (its RSS is then its own, from `/proc`), waits until it binds a probe pod of each
//!    class, and creates the case's pods from `--clients` concurrent clients as fast as the
//!    server takes them. The bench's watch marks each pod bound when it first shows a
//!    `spec.nodeName`; the number bound is sampled every second and turned into
//!    SchedulingThroughput as scheduler_perf's collector does ([`throughput::scheduling_throughput`]).
//! 3. **backlog** (unless `--no-backlog`): the scheduler stopped and the pods deleted, all pods
//!    are created first, then a new scheduler process starts and drains them: the scheduler's
//!    binding rate with no creates competing for the server.
//! 4. **in process** (unless `--no-in-process`): a second server with its own scheduler inside
//!    (no `--no-scheduler`, in-process client without TLS), the same Nodes, and run 2 again; its
//!    memory is the server's, API and store included. Its `/metrics` give the scheduler's mean
//!    decision time per pod.
//!
//! Case 2 (unless `--no-case2`) is run 2 on a third server with fewer Nodes and pods in groups of
//! one fake ReplicaSet each: required pod anti-affinity on the hostname (even groups) or a hard
//! topology spread over zones with maxSkew 1 (odd groups), printed with its ratio to case 1.
//!
//! After every scheduled run the placements of all pods are checked (RuntimeClass handler on the
//! node, no tainted node, anti-affinity, spread skew) and the run fails loudly on any violation.
//! Figures are printed (and written as JSON with `--json`), never asserted. Every process started
//! is stopped, and the run directory removed unless `--keep-dir`.

pub(crate) mod objects;
mod report;
mod throughput;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::{Binding, Namespace, Node, ObjectReference, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use self::objects::Workload;
use self::report::{Floor, Report, RunResult};
use self::throughput::{BindWatch, Tracker};
use crate::agent::cluster::{self, ProcMemory};
use crate::cri::daemons::Daemon;
use crate::stats::Latencies;

/// The namespace of the measured pods, of the floor's and of the probes.
const NAMESPACE: &str = "bench";
const FLOOR_NAMESPACE: &str = "bench-floor";
const PROBE_NAMESPACE: &str = "bench-probe";
/// No scheduler answers to this name: the floor's pods wait for the bench's own bindings.
const FLOOR_SCHEDULER: &str = "berth-bench-floor";
/// How long the scheduler may take to bind its probe pods after it starts.
const PROBE_PATIENCE: Duration = Duration::from_secs(60);
/// Idle time after a run before the memory is read.
const SETTLE: Duration = Duration::from_secs(2);

#[derive(clap::Args)]
pub struct SchedulerArgs {
    /// Nodes of case 1.
    #[arg(long, default_value_t = 5000)]
    nodes: usize,
    /// Pods of case 1 (a third each of RuntimeClass runc, crun and gvisor).
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    /// Nodes of case 2 (anti-affinity and topology spread).
    #[arg(long, default_value_t = 1000)]
    case2_nodes: usize,
    /// Pods of case 2.
    #[arg(long, default_value_t = 5000)]
    case2_pods: usize,
    /// Pods per group (one fake ReplicaSet) in case 2.
    #[arg(long, default_value_t = 100)]
    group_size: usize,
    /// Concurrent clients creating nodes and pods.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Bindings in flight of the floor (the scheduler writes 64 at once).
    #[arg(long, default_value_t = 64)]
    binds_in_flight: usize,
    /// Pods the floor creates and binds (default: --pods).
    #[arg(long)]
    floor_pods: Option<usize>,
    /// Seconds between samples of the bound count (scheduler_perf: 1).
    #[arg(long, default_value_t = 1.0)]
    sample_interval: f64,
    /// Skip the backlog run (pods created first, then drained by a new scheduler process).
    #[arg(long)]
    no_backlog: bool,
    /// Skip the run with the scheduler inside `berth server`.
    #[arg(long)]
    no_in_process: bool,
    /// Skip case 2.
    #[arg(long)]
    no_case2: bool,
    /// `BERTH_LOG` of the scheduler process (its log stays in the run directory while it runs).
    #[arg(long, default_value = "info")]
    scheduler_log: String,
    /// Keep the run directory (the logs of servers and schedulers) instead of removing it.
    #[arg(long)]
    keep_dir: bool,
    /// The `berth` binary; default: next to this binary.
    #[arg(long)]
    berth_binary: Option<PathBuf>,
    /// Also write the figures here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub async fn run(args: SchedulerArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    ensure!(args.clients > 0 && args.binds_in_flight > 0, "--clients and --binds-in-flight must be positive");
    ensure!(
        args.pods > 0 && args.group_size > 0 && args.floor_pods != Some(0),
        "--pods, --group-size and --floor-pods must be positive"
    );
    ensure!(args.sample_interval >= 0.01, "--sample-interval must be at least 0.01 s");
    if let Some(why) = (Workload::Basic { pods: args.pods }).unfit(args.nodes) {
        bail!("case 1 does not fit: {why}");
    }
    if !args.no_case2
        && let Some(why) =
            (Workload::Groups { pods: args.case2_pods, group_size: args.group_size }).unfit(args.case2_nodes)
    {
        bail!("case 2 does not fit: {why}");
    }
    let binary = match &args.berth_binary {
        Some(p) => p.clone(),
        None => crate::cri::default_berth_binary()?,
    };
    ensure!(binary.exists(), "no berth binary at {} (cargo build --release -p berth)", binary.display());
    let dir = tempfile::Builder::new().prefix("berth-bench-scheduler.").tempdir()?;
    eprintln!("run directory {}", dir.path().display());
    // Every daemon is stopped when `measure` returns, before the directory goes.
    let result = measure(&args, &binary, dir.path()).await;
    if args.keep_dir {
        let kept = dir.keep();
        eprintln!("run directory kept: {}", kept.display());
    }
    let report = result?;
    report.print();
    crate::finish_run(args.json.as_deref(), || report.to_json(), started)
}

async fn measure(args: &SchedulerArgs, binary: &Path, root: &Path) -> anyhow::Result<Report> {
    let interval = Duration::from_secs_f64(args.sample_interval);
    let basic = Workload::Basic { pods: args.pods };
    let mut runs = Vec::new();

    eprintln!("case 1: berth server --no-scheduler, {} nodes", args.nodes);
    let mut c1 = Cluster::start(binary, &root.join("case1"), Setup::Process, args).await?;
    c1.create_nodes(args.nodes, args.clients).await?;
    let floor_pods = args.floor_pods.unwrap_or(args.pods);
    eprintln!("  floor: {floor_pods} pods created, then bound from the bench ({} in flight)", args.binds_in_flight);
    let floor = c1.floor(floor_pods, args).await?;
    eprintln!("  starting berth scheduler --leader-elect=false");
    c1.start_scheduler()?;
    c1.wait_scheduling().await?;
    eprintln!("  {} pods created while scheduling ({} clients)", args.pods, args.clients);
    runs.push(c1.measure(1, basic, Arrival::WhileScheduling, args, interval).await?);
    if !args.no_backlog {
        eprintln!("  backlog: scheduler stopped, pods deleted, {} pods created, then a new scheduler", args.pods);
        c1.stop_scheduler();
        c1.delete_pods(NAMESPACE).await?;
        runs.push(c1.measure(1, basic, Arrival::Backlog, args, interval).await?);
    }
    drop(c1);

    if !args.no_in_process {
        eprintln!("case 1 in process: berth server with its scheduler, {} nodes", args.nodes);
        let mut c = Cluster::start(binary, &root.join("case1-in-process"), Setup::InProcess, args).await?;
        c.create_nodes(args.nodes, args.clients).await?;
        c.wait_scheduling().await?;
        eprintln!("  {} pods created while scheduling ({} clients)", args.pods, args.clients);
        runs.push(c.measure(1, basic, Arrival::WhileScheduling, args, interval).await?);
    }

    if !args.no_case2 {
        let groups = Workload::Groups { pods: args.case2_pods, group_size: args.group_size };
        eprintln!("case 2: berth server --no-scheduler, {} nodes, berth scheduler", args.case2_nodes);
        let mut c = Cluster::start(binary, &root.join("case2"), Setup::Process, args).await?;
        c.create_nodes(args.case2_nodes, args.clients).await?;
        c.start_scheduler()?;
        c.wait_scheduling().await?;
        eprintln!(
            "  {} pods in groups of {} (anti-affinity / topology spread) created while scheduling",
            args.case2_pods, args.group_size
        );
        runs.push(c.measure(2, groups, Arrival::WhileScheduling, args, interval).await?);
    }

    Ok(Report {
        nodes: args.nodes,
        pods: args.pods,
        case2_nodes: args.case2_nodes,
        case2_pods: args.case2_pods,
        group_size: args.group_size,
        clients: args.clients,
        binds_in_flight: args.binds_in_flight,
        sample_interval: interval,
        floor,
        runs,
    })
}

/// Where the scheduler runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setup {
    /// `berth scheduler` as a process of its own, beside `berth server --no-scheduler`.
    Process,
    /// Inside `berth server`.
    InProcess,
}

/// How the pods meet the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Created while the scheduler runs.
    WhileScheduling,
    /// All created first; the scheduler starts afterwards.
    Backlog,
}

/// One `berth server` of the run, its admin client, and the scheduler process when it runs apart.
struct Cluster {
    binary: PathBuf,
    dir: PathBuf,
    setup: Setup,
    server: Daemon,
    admin: kube::Client,
    kubeconfig: PathBuf,
    scheduler: Option<Daemon>,
    scheduler_log: String,
    /// Clients of the creators, each with its own connections.
    clients: Vec<kube::Client>,
    nodes: usize,
    probes: usize,
}

impl Cluster {
    async fn start(binary: &Path, dir: &Path, setup: Setup, args: &SchedulerArgs) -> anyhow::Result<Cluster> {
        std::fs::create_dir_all(dir)?;
        let mut extra = vec![match setup {
            Setup::Process => "--no-scheduler",
            Setup::InProcess => "--leader-elect=false",
        }];
        if runs_controllers(binary)? {
            // No node lifecycle controller to find the agentless nodes unreachable and taint
            // them, no garbage collector to remove pods whose ReplicaSet does not exist.
            extra.push("--controllers=-*");
        }
        if server_has_flag(binary, "--disable-admission-plugins")? {
            // No serviceaccount controller either: pods need no ServiceAccount.
            extra.push("--disable-admission-plugins=ServiceAccount");
        }
        let (server, admin, data_dir) = cluster::start_server_with(binary, dir, &extra).await?;
        let kubeconfig = data_dir.join("admin.kubeconfig");
        let mut clients = Vec::new();
        for _ in 0..args.clients {
            clients.push(cluster::client(&kubeconfig).await?);
        }
        for ns in [NAMESPACE, FLOOR_NAMESPACE, PROBE_NAMESPACE] {
            let obj: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))?;
            Api::<Namespace>::all(admin.clone())
                .create(&PostParams::default(), &obj)
                .await
                .with_context(|| format!("creating namespace {ns}"))?;
        }
        for class in objects::runtime_classes() {
            Api::<RuntimeClass>::all(admin.clone()).create(&PostParams::default(), &class).await?;
        }
        Ok(Cluster {
            binary: binary.to_owned(),
            dir: dir.to_owned(),
            setup,
            server,
            admin,
            kubeconfig,
            scheduler: None,
            scheduler_log: args.scheduler_log.clone(),
            clients,
            nodes: 0,
            probes: 0,
        })
    }

    /// Creates nodes `0..n`; sets their status through the status subresource if the create
    /// dropped it (kubelets register with status, and berth keeps it).
    async fn create_nodes(&mut self, n: usize, workers: usize) -> anyhow::Result<()> {
        let api: Api<Node> = Api::all(self.admin.clone());
        let first = api.create(&PostParams::default(), &objects::node(0)).await.context("creating node 0")?;
        let keeps_status = objects::status_kept(&first);
        if !keeps_status {
            set_node_status(&api, first, 0).await?;
        }
        let op = move |client: kube::Client, i: usize| async move {
            let api: Api<Node> = Api::all(client);
            let created = api
                .create(&PostParams::default(), &objects::node(i))
                .await
                .with_context(|| format!("creating node {i}"))?;
            if !keeps_status {
                set_node_status(&api, created, i).await?;
            }
            anyhow::Ok(())
        };
        let (_, took) = in_parallel(&self.clients, workers, 1..n, op).await?;
        let stored = Api::<Node>::all(self.admin.clone()).get(&objects::node_name(n - 1)).await?;
        ensure!(objects::status_kept(&stored), "node {} has no allocatable, runtime handlers or Ready", n - 1);
        eprintln!(
            "  {n} nodes created in {:.1} s{}",
            took.as_secs_f64(),
            if keeps_status { "" } else { " (status set through the status subresource)" }
        );
        self.nodes = n;
        Ok(())
    }

    /// The raw floor: `n` pods no scheduler takes, created, then bound from the bench, then
    /// deleted again.
    async fn floor(&self, n: usize, args: &SchedulerArgs) -> anyhow::Result<Floor> {
        let create = move |client: kube::Client, i: usize| async move {
            let api: Api<Pod> = Api::namespaced(client, FLOOR_NAMESPACE);
            api.create(&PostParams::default(), &objects::basic_pod(i, Some(FLOOR_SCHEDULER))).await?;
            anyhow::Ok(())
        };
        let (create_lat, create_wall) = in_parallel(&self.clients, args.clients, 0..n, create).await?;
        // Targets as a scheduler would pick them: nodes that run the pod's handler.
        let targets: Arc<Vec<Vec<usize>>> = Arc::new(
            objects::CLASSES
                .iter()
                .map(|(_, h)| (0..self.nodes).filter(|&node| objects::fits(node, h)).collect())
                .collect(),
        );
        let bind_one = move |client: kube::Client, i: usize| {
            let targets = targets.clone();
            async move {
                let class = objects::basic_class(i);
                let node = targets[class][i % targets[class].len()];
                bind(&Api::namespaced(client, FLOOR_NAMESPACE), &objects::pod_name(i), &objects::node_name(node)).await
            }
        };
        // One client, as the scheduler's, with `binds_in_flight` requests at once.
        let one = [self.admin.clone()];
        let (bind_lat, bind_wall) = in_parallel(&one, args.binds_in_flight, 0..n, bind_one).await?;
        let bound = Api::<Pod>::namespaced(self.admin.clone(), FLOOR_NAMESPACE).list(&ListParams::default()).await?;
        let on_node =
            bound.items.iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()).count();
        ensure!(on_node == n, "the floor bound {on_node} of its {n} pods");
        self.delete_pods(FLOOR_NAMESPACE).await?;
        Ok(Floor { pods: n, create: create_lat, create_wall, bind: bind_lat, bind_wall })
    }

    /// Deletes every pod of `namespace` at once (grace period 0) and waits until none is left.
    async fn delete_pods(&self, namespace: &str) -> anyhow::Result<()> {
        let api: Api<Pod> = Api::namespaced(self.admin.clone(), namespace);
        let started = Instant::now();
        api.delete_collection(&DeleteParams::default().grace_period(0), &ListParams::default())
            .await
            .with_context(|| format!("deleting the pods of {namespace}"))?;
        loop {
            let left = api.list(&ListParams::default().limit(1)).await?;
            if left.items.is_empty() {
                break;
            }
            ensure!(started.elapsed() < Duration::from_secs(120), "pods of {namespace} still there after 120 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        eprintln!("  deleted the pods of {namespace} in {:.1} s", started.elapsed().as_secs_f64());
        Ok(())
    }

    /// `berth scheduler --leader-elect=false` against this server, as a process of its own.
    fn start_scheduler(&mut self) -> anyhow::Result<()> {
        ensure!(self.setup == Setup::Process, "the scheduler runs inside this server");
        let path = |p: &Path| p.to_string_lossy().into_owned();
        // Through env(1), which execs: the daemon's pid is the scheduler's.
        let args: Vec<String> = vec![
            format!("BERTH_LOG={}", self.scheduler_log),
            "NO_COLOR=1".into(),
            path(&self.binary),
            "scheduler".into(),
            "--kubeconfig".into(),
            path(&self.kubeconfig),
            "--leader-elect=false".into(),
        ];
        let log = self.dir.join("scheduler.log");
        self.scheduler = Some(Daemon::spawn(Path::new("/usr/bin/env"), &args, &log)?);
        Ok(())
    }

    fn stop_scheduler(&mut self) {
        if let Some(mut scheduler) = self.scheduler.take() {
            scheduler.stop();
        }
    }

    /// The process whose memory is the scheduler's: its own, or the server it runs in.
    fn scheduler_pid(&self) -> u32 {
        self.scheduler.as_ref().map_or(self.server.pid, |s| s.pid)
    }

    /// Creates a probe pod of each class and waits until the scheduler has bound them all: it
    /// has listed nodes, classes and pods and places pods.
    async fn wait_scheduling(&mut self) -> anyhow::Result<()> {
        let api: Api<Pod> = Api::namespaced(self.admin.clone(), PROBE_NAMESPACE);
        let mut names = Vec::new();
        for class in 0..objects::CLASSES.len() {
            let mut pod = objects::basic_pod(class, None);
            let name = format!("probe-{}-{}", self.probes, objects::CLASSES[class].0);
            pod.metadata.name = Some(name.clone());
            api.create(&PostParams::default(), &pod).await.context("creating a probe pod")?;
            names.push(name);
        }
        self.probes += 1;
        let deadline = Instant::now() + PROBE_PATIENCE;
        for name in names {
            loop {
                self.ensure_alive()?;
                let pod = api.get(&name).await?;
                if pod.spec.and_then(|s| s.node_name).is_some_and(|n| !n.is_empty()) {
                    break;
                }
                ensure!(Instant::now() < deadline, "probe pod {name} not bound {PROBE_PATIENCE:?} after the start");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    fn ensure_alive(&self) -> anyhow::Result<()> {
        ensure!(cluster::alive(self.server.pid), "berth server exited:\n{}", self.server.log_tail());
        if let Some(s) = &self.scheduler {
            ensure!(cluster::alive(s.pid), "berth scheduler exited:\n{}", s.log_tail());
        }
        Ok(())
    }

    /// One scheduled run of `workload` in [`NAMESPACE`]; checks every placement afterwards.
    async fn measure(
        &mut self,
        case: u8,
        workload: Workload,
        arrival: Arrival,
        args: &SchedulerArgs,
        interval: Duration,
    ) -> anyhow::Result<RunResult> {
        let total = workload.pods();
        let api: Api<Pod> = Api::namespaced(self.admin.clone(), NAMESPACE);
        let tracker = Tracker::new(total);
        let mut watch = BindWatch::start(api.clone(), tracker.clone()).await?;
        let creator = {
            let tracker = tracker.clone();
            move |client: kube::Client, i: usize| {
                let tracker = tracker.clone();
                async move {
                    let pod = workload.pod(i);
                    tracker.created(i);
                    Api::<Pod>::namespaced(client, NAMESPACE)
                        .create(&PostParams::default(), &pod)
                        .await
                        .with_context(|| format!("creating pod {i}"))?;
                    anyhow::Ok(())
                }
            }
        };
        let (creates, create_wall, origin, cpu_before, samples) = match arrival {
            Arrival::WhileScheduling => {
                let cpu_before = self.cpu_times()?;
                let origin = Instant::now();
                let creating = in_parallel(&self.clients, args.clients, 0..total, creator);
                let (created, samples) = tokio::try_join!(creating, tracker.sample(&mut watch, interval))?;
                (created.0, Some(created.1), origin, cpu_before, samples)
            }
            Arrival::Backlog => {
                let (creates, _) = in_parallel(&self.clients, args.clients, 0..total, creator).await?;
                self.start_scheduler()?;
                let cpu_before = self.cpu_times()?;
                let origin = Instant::now();
                let samples = tracker.sample(&mut watch, interval).await?;
                (creates, None, origin, cpu_before, samples)
            }
        };
        let wall = origin.elapsed();
        let cpu_after = self.cpu_times()?;
        drop(watch);
        self.ensure_alive()?;
        let (first, last) = tracker.bind_window().context("no pod bound")?;
        let latency = (arrival == Arrival::WhileScheduling).then(|| tracker.latencies());
        tokio::time::sleep(SETTLE).await;
        let memory = ProcMemory::read(self.scheduler_pid())?;
        let attempt_mean_ms = match self.setup {
            Setup::InProcess => self.mean_attempt_ms().await.ok(),
            Setup::Process => None,
        };
        let checked = self.check_placements(workload).await?;
        let result = RunResult {
            case,
            setup: self.setup,
            arrival,
            nodes: self.nodes,
            pods: total,
            throughputs: throughput::scheduling_throughput(&samples),
            samples,
            first_bind: first.saturating_duration_since(origin),
            bind_window: last - first,
            wall,
            create_wall,
            creates,
            latency,
            memory,
            scheduler_cpu: (self.setup == Setup::Process).then(|| cpu_after.0.saturating_sub(cpu_before.0)),
            server_cpu: cpu_after.1.saturating_sub(cpu_before.1),
            bench_cpu: cpu_after.2.saturating_sub(cpu_before.2),
            attempt_mean_ms,
            checked,
        };
        eprintln!("  {}", result.summary());
        Ok(result)
    }

    /// CPU time used so far by the scheduler process (zero when in process), the server and
    /// the bench itself.
    fn cpu_times(&self) -> anyhow::Result<(Duration, Duration, Duration)> {
        let scheduler = match &self.scheduler {
            Some(s) => cluster::cpu_time(s.pid)?,
            None => Duration::ZERO,
        };
        Ok((scheduler, cluster::cpu_time(self.server.pid)?, cluster::cpu_time(std::process::id())?))
    }

    /// Lists the run's pods and fails if one is unbound or placed against what it asks for.
    /// Returns how many placements were checked.
    async fn check_placements(&self, workload: Workload) -> anyhow::Result<usize> {
        let pods = Api::<Pod>::namespaced(self.admin.clone(), NAMESPACE).list(&ListParams::default()).await?;
        let mut placement = std::collections::HashMap::new();
        for pod in &pods.items {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
            ensure!(!node.is_empty(), "pod {name} is not bound");
            if let Some(i) = objects::pod_index(name) {
                placement.insert(i, node);
            }
        }
        ensure!(placement.len() == workload.pods(), "{} pods listed, not {}", placement.len(), workload.pods());
        let violations = workload.violations(&placement, self.nodes);
        if !violations.is_empty() {
            bail!(
                "{} placement(s) break what the pods ask for, e.g.:\n  {}",
                violations.len(),
                violations.iter().take(10).cloned().collect::<Vec<_>>().join("\n  ")
            );
        }
        Ok(placement.len())
    }

    /// The scheduler's mean decision time per placed pod, from the server's `/metrics`.
    async fn mean_attempt_ms(&self) -> anyhow::Result<f64> {
        let request = http::Request::get("/metrics").body(Vec::new())?;
        let text = self.admin.request_text(request).await?;
        let series = |suffix: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with(&format!("scheduler_scheduling_attempt_duration_seconds_{suffix}{{"))
                        && l.contains("result=\"scheduled\"")
                })
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .with_context(|| format!("no scheduling_attempt_duration_seconds_{suffix} in /metrics"))
        };
        let (sum, count) = (series("sum")?, series("count")?);
        ensure!(count > 0.0, "no scheduled attempts in /metrics");
        Ok(sum / count * 1000.0)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The scheduler first, while the server still answers it; the server with the fields.
        self.stop_scheduler();
    }
}

/// Whether this `berth server` runs controllers in process (it has `--controllers`).
pub(crate) fn runs_controllers(binary: &Path) -> anyhow::Result<bool> {
    server_has_flag(binary, "--controllers")
}

/// The `berth` binary a bench of the server with its controllers runs: `given`, else the one next
/// to this bench; it must exist and run controllers in process.
pub(crate) fn controllers_binary(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let binary = match given {
        Some(p) => p.to_path_buf(),
        None => crate::cri::default_berth_binary()?,
    };
    anyhow::ensure!(binary.exists(), "no berth binary at {} (cargo build --release -p berth)", binary.display());
    anyhow::ensure!(
        runs_controllers(&binary)?,
        "{} has no --controllers: it runs no controllers in process",
        binary.display()
    );
    Ok(binary)
}

/// Whether this `berth server` takes `flag`.
fn server_has_flag(binary: &Path, flag: &str) -> anyhow::Result<bool> {
    let help = std::process::Command::new(binary).args(["server", "--help"]).output().context("berth server --help")?;
    Ok(String::from_utf8_lossy(&help.stdout).contains(flag))
}

/// Puts node `i`'s status on `created` through the status subresource.
async fn set_node_status(api: &Api<Node>, mut created: Node, i: usize) -> anyhow::Result<()> {
    created.status = objects::node(i).status;
    api.replace_status(&objects::node_name(i), &PostParams::default(), &created)
        .await
        .with_context(|| format!("setting the status of node {i}"))?;
    Ok(())
}

/// Writes a binding of pod `name` to `node`.
async fn bind(api: &Api<Pod>, name: &str, node: &str) -> anyhow::Result<()> {
    let binding = Binding {
        metadata: ObjectMeta { name: Some(name.to_owned()), ..Default::default() },
        target: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.to_owned()),
            ..Default::default()
        },
    };
    api.create_subresource::<Binding, serde_json::Value>("binding", name, &PostParams::default(), &binding)
        .await
        .with_context(|| format!("binding {name} to {node}"))?;
    Ok(())
}

/// Runs `op(client, i)` for every `i` of `range` from `workers` tasks, worker `w` taking the
/// `w`-th, `w + workers`-th, … index (so that classes and groups interleave) and client
/// `w % clients.len()`; returns each op's latency and the wall time of all.
pub(crate) async fn in_parallel<F, Fut>(
    clients: &[kube::Client],
    workers: usize,
    range: std::ops::Range<usize>,
    op: F,
) -> anyhow::Result<(Latencies, Duration)>
where
    F: Fn(kube::Client, usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let (client, op, range) = (clients[w % clients.len()].clone(), op.clone(), range.clone());
            tokio::spawn(async move {
                let mut lat = Latencies::default();
                for i in range.skip(w).step_by(workers) {
                    let t0 = Instant::now();
                    op(client.clone(), i).await?;
                    lat.record(t0.elapsed());
                }
                anyhow::Ok(lat)
            })
        })
        .collect();
    let mut all = Latencies::default();
    for task in tasks {
        all.add(&task.await??);
    }
    Ok((all, started.elapsed()))
}
