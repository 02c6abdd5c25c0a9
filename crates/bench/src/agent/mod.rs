//! `berth-bench agent`: pod start latency through the whole node path — API create, the agent's
//! watch and pod worker, CRI, the watch that sees the pod Running — per handler (runc, crun,
//! gVisor), next to the CRI calls alone and to the raw OCI runtime floor, all in the same run;
//! and the agent's resident memory with the pods running.
//!
//! The bench starts everything it measures: a loopback registry with busybox, the release
//! `berth server`, `berth runtime` and `berth agent` (as a node with its own token), each with a
//! temp dir of this run. For each handler it repeats, pod by pod, one floor sample (`runc run` /
//! `crun run` / `runsc run` of `true`, plus CNI ADD+DEL), one CRI-only pod (RunPodSandbox,
//! CreateContainer, StartContainer of `sleep` straight against the runtime) and one pod through
//! the API, so that the three see the same machine load; the last two swap places every other
//! time, as a pod that just started still busies the machine for the one after it. Pods of both
//! kinds keep running until the handler's last one; then the agent is left idle for a moment and
//! its memory read, and all pods are deleted (through the API, and by CRI for the CRI-only ones)
//! before the next handler.
//!
//! The agent's overhead is pod start minus CRI only at p50, and also the median of each pod's
//! start minus the CRI-only pod measured next to it (which cancels slow drifts of the
//! machine's load). Pods are BestEffort unless
//! `--cpu-request` is given (kubelet's `cpu.shares` of 2 for their cgroup, which under CPU
//! contention slows runc's Go `init` and so the start; the CRI-only pods run in the runtime's own
//! cgroups). A pod whose first container start fails (a runtime error) is counted apart and left
//! to the agent's back-off: it says nothing about the path measured. `--samples` writes every
//! pod's wall-clock start, to line it up with the daemons' logs (`--keep-dir`, `--agent-log`).
//!
//! Figures are printed (and written as JSON with `--json`), never asserted. Everything started is
//! stopped and removed again, also when a step fails.

pub(crate) mod cluster;
pub(crate) mod pods;
mod report;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use berth_testenv::Registry;
use berth_testenv::images::{Format, busybox_image};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use self::cluster::ProcMemory;
use self::report::{HandlerResult, Report};
use crate::cri::client::{self, CriClient, PodSpec};
use crate::cri::daemons::{self, Daemon};
use crate::cri::net::{self, CniFloor, HostState};
use crate::cri::{HANDLERS, floor};

/// The node the agent registers.
const NODE: &str = "bench-node";
/// The namespace of the bench's pods.
const NAMESPACE: &str = "berth-bench";
/// How long the agent's memory is sampled at the end of each settle.
const MEMORY_WINDOW: Duration = Duration::from_secs(6);
/// Addresses the runtime's /24 can give out at once, with room for the floor's.
const ADDRESSES: usize = 250;
/// Where the agent keeps container logs (kubelet's layout).
const POD_LOG_DIR: &str = "/var/log/pods";

#[derive(clap::Args)]
pub struct AgentArgs {
    /// Pods per handler through the agent, and as many CRI-only pods and floor samples.
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// Pods for gvisor (default: --pods).
    #[arg(long)]
    gvisor_pods: Option<usize>,
    /// Handlers to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "runc,crun,gvisor")]
    handlers: Vec<String>,
    /// Unrecorded pods of each kind per handler before the measured ones (deleted before those).
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// CPU request of each pod's container (e.g. `500m`); without one the pods are BestEffort,
    /// whose cgroups get kubelet's minimum `cpu.shares` of 2.
    #[arg(long)]
    cpu_request: Option<String>,
    /// Seconds the agent is left alone with the pods running before its memory is read; the
    /// last 6 s of them (two of the agent's 3 s periods of giving free heap and touched code
    /// pages back) are sampled every 100 ms.
    #[arg(long, default_value_t = 12)]
    settle: u64,
    /// `BERTH_LOG` of the agent (its log stays in the run directory while it runs).
    #[arg(long, default_value = "info")]
    agent_log: String,
    /// Keep the run directory (logs of server, runtime and agent) instead of removing it.
    #[arg(long)]
    keep_dir: bool,
    /// The `berth` binary (with `berth-monitor` next to it); default: next to this binary.
    #[arg(long)]
    berth_binary: Option<PathBuf>,
    /// Also write the figures here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also write every measured pod here as CSV (wall-clock start in µs since the epoch, then
    /// milliseconds), to line the starts up with the daemons' logs.
    #[arg(long)]
    samples: Option<PathBuf>,
}

impl AgentArgs {
    fn pods_for(&self, handler: &str) -> usize {
        match (handler, self.gvisor_pods) {
            ("gvisor", Some(n)) => n,
            _ => self.pods,
        }
    }
}

/// The runtime under test and a CRI client of the bench's own.
struct Runtime {
    daemon: Daemon,
    client: CriClient,
    version: String,
}

/// What the run set up, torn down in reverse whatever happened in between.
struct Session {
    dir: tempfile::TempDir,
    server: Option<Daemon>,
    admin: Option<kube::Client>,
    runtime: Option<Runtime>,
    agent: Option<Daemon>,
    /// UIDs of the pods created through the API, whose cgroups the agent should have removed.
    pod_uids: Vec<String>,
}

impl Session {
    async fn tear_down(mut self, keep_dir: bool) {
        // Pods first, while the agent runs to stop them; what it leaves, CRI removes below.
        if let (Some(admin), Some(agent)) = (&self.admin, &self.agent)
            && cluster::alive(agent.pid)
        {
            let api: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
            // Also the pods whose start the run did not see through (their cgroups and logs).
            if let Ok(left) = api.list(&kube::api::ListParams::default().labels(pods::SELECTOR)).await {
                self.pod_uids.extend(left.items.into_iter().filter_map(|p| p.metadata.uid));
            }
            match tokio::time::timeout(Duration::from_secs(120), pods::delete_all(&api)).await {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => eprintln!("deleted {n} pod(s) left in the API"),
                Ok(Err(e)) => eprintln!("deleting the pods left in the API failed: {e:#}"),
                Err(_) => eprintln!("deleting the pods left in the API timed out"),
            }
        }
        if let Some(mut agent) = self.agent.take() {
            agent.stop();
            cluster::remove_proxy_table();
        }
        if let Some(mut runtime) = self.runtime.take() {
            match runtime.client.remove_all().await {
                Ok(0) => {}
                Ok(n) => eprintln!("removed {n} pod(s) left in berth runtime"),
                Err(e) => eprintln!("removing the pods left in berth runtime failed: {e:#}"),
            }
            runtime.daemon.stop();
        }
        if let Some(mut server) = self.server.take() {
            server.stop();
        }
        remove_pod_cgroups(&self.pod_uids);
        remove_pod_logs(&self.pod_uids);
        daemons::unmount_under(self.dir.path());
        if keep_dir {
            let kept = self.dir.keep();
            eprintln!("run directory kept: {}", kept.display());
        }
    }
}

/// Removes the pod cgroups (kubelet's cgroupfs layout) of `uids` that are still there, emptied
/// of processes: in the unified hierarchy and in every v1 controller's.
fn remove_pod_cgroups(uids: &[String]) {
    let root = Path::new("/sys/fs/cgroup");
    let mut hierarchies = vec![root.to_owned()];
    hierarchies.extend(std::fs::read_dir(root).into_iter().flatten().flatten().map(|e| e.path()));
    for uid in uids {
        for hierarchy in &hierarchies {
            for parent in ["kubepods", "kubepods/burstable", "kubepods/besteffort"] {
                remove_cgroup_tree(&hierarchy.join(parent).join(format!("pod{uid}")));
            }
        }
    }
}

/// rmdir of a cgroup and its descendants, deepest first.
fn remove_cgroup_tree(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&entry.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Removes the bench pods' log directories under `/var/log/pods` the agent left.
fn remove_pod_logs(uids: &[String]) {
    let Ok(entries) = std::fs::read_dir(POD_LOG_DIR) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&format!("{NAMESPACE}_")) && uids.iter().any(|u| name.ends_with(u.as_str())) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    ensure!(args.pods > 0 && args.gvisor_pods != Some(0), "--pods and --gvisor-pods must be positive");
    ensure!(!args.handlers.is_empty(), "--handlers names none");
    for h in &args.handlers {
        ensure!(HANDLERS.contains(&h.as_str()), "unknown handler {h:?}; known: {}", HANDLERS.join(", "));
        let running = 2 * args.pods_for(h).max(args.warmup);
        ensure!(running < ADDRESSES, "{running} pods running at once do not fit the runtime's /24 network");
    }
    let berth_binary = match &args.berth_binary {
        Some(p) => p.clone(),
        None => crate::cri::default_berth_binary()?,
    };
    let host = HostState::take(&[&daemons::BERTH_NETWORK])?;
    let dir = tempfile::Builder::new().prefix("berth-bench-agent.").tempdir()?;
    eprintln!("run directory {}", dir.path().display());
    let mut session = Session { dir, server: None, admin: None, runtime: None, agent: None, pod_uids: Vec::new() };
    let result = measure(&args, &berth_binary, &mut session).await;
    session.tear_down(args.keep_dir).await;
    drop(host);
    let report = result?;
    report.print();
    crate::finish_run(args.json.as_deref(), || report.to_json(), started)
}

async fn measure(args: &AgentArgs, berth_binary: &Path, session: &mut Session) -> anyhow::Result<Report> {
    let root = session.dir.path().to_owned();
    eprintln!("starting docker-registry on loopback, pushing busybox");
    let registry = Registry::start();
    let busybox = tokio::task::spawn_blocking(|| busybox_image(Format::Oci)).await?;
    registry.push_image("busybox", "latest", &busybox).await;
    let image = registry.reference("busybox:latest");
    // The floor first: its helpers fail on a broken host before anything holds pods.
    let floor_dir = root.join("floor");
    let bundle = floor::write_bundle(&floor_dir)?;
    let cni = CniFloor::new(&net::conflist(&daemons::BERTH_NETWORK, &floor_dir.join("ipam")))?;

    eprintln!("starting berth server, berth runtime and berth agent ({})", berth_binary.display());
    let server_dir = root.join("server");
    std::fs::create_dir_all(&server_dir)?;
    let (server, admin, data_dir) = cluster::start_server(berth_binary, &server_dir).await?;
    let server_pid = server.pid;
    session.server = Some(server);
    session.admin = Some(admin.clone());

    let runtime_dir = root.join("runtime");
    std::fs::create_dir_all(&runtime_dir)?;
    let (daemon, socket) = daemons::start_berth(berth_binary, &runtime_dir, registry.host())?;
    let mut client = match CriClient::wait_ready(&socket, Duration::from_secs(30)).await {
        Ok(c) => c,
        Err(e) => bail!("berth runtime did not become ready: {e:#}\n{}", daemon.log_tail()),
    };
    let version = client.version().await?;
    let runtime = session.runtime.insert(Runtime { daemon, client, version });
    for handler in &args.handlers {
        runtime.client.pull(&image, handler).await?;
    }

    let node_kubeconfig = root.join("node.kubeconfig");
    cluster::node_kubeconfig(berth_binary, &data_dir, NODE, &node_kubeconfig)?;
    let agent =
        cluster::start_agent(berth_binary, &root.join("agent"), NODE, &node_kubeconfig, &socket, &args.agent_log)?;
    let agent_pid = agent.pid;
    let agent = session.agent.insert(agent);
    let node = cluster::wait_node_ready(&admin, NODE, agent).await?;
    let node_info = node.status.and_then(|s| s.node_info).map(|i| i.container_runtime_version).unwrap_or_default();
    cluster::create_objects(&admin, NAMESPACE, &args.handlers).await?;

    let api: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    let mut watch = pods::StartWatch::start(api.clone()).await?;
    let idle_memory = agent_memory(agent_pid, args.settle).await?;

    let floor = Floor { dir: floor_dir, bundle, cni };
    let pids = Pids { agent: agent_pid, server: server_pid };
    let mut results = Vec::new();
    let mut samples = Vec::new();
    for handler in &args.handlers {
        let runtime = session.runtime.as_mut().context("runtime")?;
        let mut run = HandlerRun { args, handler, image: &image, api: &api, runtime, floor: &floor, pids };
        let logs = client::log_dir(&root, "cri", handler)?;
        results.push(run.measure(&mut watch, &logs, &mut samples, &mut session.pod_uids).await?);
    }
    if let Some(path) = &args.samples {
        write_samples(path, &samples).with_context(|| format!("writing {}", path.display()))?;
    }
    drop(watch);
    drop(floor);
    drop(registry);
    let runtime = session.runtime.as_ref().context("runtime")?;
    Ok(Report {
        pods: args.pods,
        warmup: args.warmup,
        settle: args.settle,
        image,
        cpu_request: args.cpu_request.clone(),
        runtime_version: runtime.version.clone(),
        node_runtime_version: node_info,
        idle_memory,
        handlers: results,
    })
}

/// The agent's memory now, or an error saying that it died.
/// The agent's memory after `settle` seconds: sampled every 100 ms over the last
/// [`MEMORY_WINDOW`], because one reading depends on where it falls between the agent's trims
/// (its code pages fault back in within a second of each). The sample with the median VmRSS,
/// with the highest VmRSS of the window as `rss_max`.
async fn agent_memory(pid: u32, settle: u64) -> anyhow::Result<ProcMemory> {
    let settle = Duration::from_secs(settle);
    tokio::time::sleep(settle.saturating_sub(MEMORY_WINDOW)).await;
    let mut samples = Vec::new();
    let end = Instant::now() + settle.min(MEMORY_WINDOW);
    loop {
        ensure!(cluster::alive(pid), "berth agent (pid {pid}) exited during the run");
        samples.push(ProcMemory::read(pid)?);
        if Instant::now() >= end {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    samples.sort_by_key(|m| m.rss);
    let mut median = samples[samples.len() / 2];
    median.rss_max = samples.last().map_or(median.rss, |m| m.rss);
    Ok(median)
}

/// The floor's bundle and CNI plugins.
struct Floor {
    dir: PathBuf,
    bundle: PathBuf,
    cni: CniFloor,
}

#[derive(Clone, Copy)]
struct Pids {
    agent: u32,
    server: u32,
}

/// A handler's pods: what each iteration needs.
struct HandlerRun<'a> {
    args: &'a AgentArgs,
    handler: &'a str,
    image: &'a str,
    api: &'a Api<Pod>,
    runtime: &'a mut Runtime,
    floor: &'a Floor,
    pids: Pids,
}

/// Pods stuck neither Running nor failed after which the run stops: each costs the whole
/// start timeout.
const MAX_TIMEOUTS: usize = 3;

impl HandlerRun<'_> {
    /// The warm-up pods, then the measured ones; then the memory with all running.
    async fn measure(
        &mut self,
        watch: &mut pods::StartWatch,
        logs: &Path,
        samples: &mut Vec<Sample>,
        uids: &mut Vec<String>,
    ) -> anyhow::Result<HandlerResult> {
        let (handler, n) = (self.handler, self.args.pods_for(self.handler));
        eprintln!("{handler}: {} warm-up + {n} pods each for floor, CRI only and the agent", self.args.warmup);
        let mut result = HandlerResult::new(handler, n);
        for i in 0..self.args.warmup {
            if let pods::Ended::Failed(reason) =
                self.iteration(&format!("w{i}"), i % 2 == 1, logs, watch, uids).await?.start.ended
            {
                eprintln!("  warm-up pod {i}: start failed: {reason}");
            }
        }
        self.clear(self.args.warmup).await?;

        let cpu_before = (cluster::cpu_time(self.pids.agent)?, cluster::cpu_time(self.pids.server)?);
        let started = Instant::now();
        let mut timed_out = 0;
        for i in 0..n {
            let sample = self.iteration(&i.to_string(), i % 2 == 1, logs, watch, uids).await?;
            result.pods_created += 1;
            result.floor_run.record(sample.floor_run);
            result.floor_cni.record(sample.floor_cni);
            result.floor_total.record(sample.floor_run + sample.floor_cni);
            result.cri.record(sample.cri);
            result.create.record(sample.start.create);
            match &sample.start.ended {
                pods::Ended::Running => {
                    result.start.record(sample.start.took);
                    result.paired_ms.push((sample.start.took.as_secs_f64() - sample.cri.as_secs_f64()) * 1000.0);
                }
                pods::Ended::Failed(reason) => {
                    // The runtime's (or the image's) failure, not the path being measured.
                    eprintln!("  {handler} pod {i}: start failed: {reason}");
                    result.failed.push(reason.clone());
                    timed_out += usize::from(sample.start.timed_out);
                    ensure!(timed_out < MAX_TIMEOUTS, "{MAX_TIMEOUTS} {handler} pods never ended their start");
                }
            }
            samples.push(sample);
        }
        let cpu_after = (cluster::cpu_time(self.pids.agent)?, cluster::cpu_time(self.pids.server)?);
        result.agent_cpu = Some(cpu_after.0.saturating_sub(cpu_before.0));
        result.server_cpu = Some(cpu_after.1.saturating_sub(cpu_before.1));
        result.wall = started.elapsed();
        // Idle with every pod running: the agent's steady state.
        result.memory = Some(agent_memory(self.pids.agent, self.args.settle).await?);
        self.clear(result.pods_created).await?;
        // What the agent keeps once its pods are gone: retained heap, or state of pods it forgot.
        result.memory_after_delete = Some(agent_memory(self.pids.agent, self.args.settle).await?);
        Ok(result)
    }

    /// One floor sample, then one CRI-only pod and one pod through the API, the pod through the
    /// API first when `agent_first` (every other iteration: a pod that just started still busies
    /// the machine, and the second of the two would always pay for it).
    async fn iteration(
        &mut self,
        tag: &str,
        agent_first: bool,
        logs: &Path,
        watch: &mut pods::StartWatch,
        uids: &mut Vec<String>,
    ) -> anyhow::Result<Sample> {
        let (handler, floor) = (self.handler, self.floor);
        let id = format!("bench-floor-{handler}-{tag}");
        let (floor_run, floor_cni) =
            tokio::task::block_in_place(|| floor::sample(handler, &floor.dir, &floor.bundle, &floor.cni, &id))?;
        let name = format!("{handler}-{tag}");
        let pod = pods::pod(&name, NODE, handler, self.image, self.args.cpu_request.as_deref())?;
        let mut start = None;
        if agent_first {
            start =
                Some(pods::start(self.api, watch, &pod).await.with_context(|| format!("agent, {handler}, pod {tag}"))?);
        }
        let spec = PodSpec::sleeping(format!("cri-{handler}-{tag}"), handler, logs, self.image);
        let (cri_at, t0) = (std::time::SystemTime::now(), Instant::now());
        let cri_only = self.runtime.client.start_long_running(&spec).await;
        let cri = t0.elapsed();
        cri_only.with_context(|| format!("CRI only, {handler}, pod {tag}"))?;
        let start = match start {
            Some(start) => start,
            None => pods::start(self.api, watch, &pod).await.with_context(|| format!("agent, {handler}, pod {tag}"))?,
        };
        uids.push(start.uid.clone());
        if matches!(start.ended, pods::Ended::Failed(_)) {
            for (what, pid) in [("berth agent", self.pids.agent), ("berth server", self.pids.server)] {
                ensure!(cluster::alive(pid), "{what} (pid {pid}) exited during the run");
            }
        }
        Ok(Sample { handler: handler.to_owned(), pod: name, start, cri_at, cri, floor_run, floor_cni })
    }

    /// Deletes the agent's pods through the API and waits until they are gone, then removes the
    /// `cri_pods` CRI-only pods; fails if the agent left a sandbox behind.
    async fn clear(&mut self, cri_pods: usize) -> anyhow::Result<()> {
        let started = Instant::now();
        let deleted =
            pods::delete_all(self.api).await.with_context(|| format!("deleting the {} pods", self.handler))?;
        let removed = self.runtime.client.remove_all().await?;
        eprintln!(
            "  deleted {deleted} pod(s) through the API and {removed} CRI-only pod(s) in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        ensure!(removed == cri_pods, "the runtime held {removed} pods after the agent's were deleted, not {cri_pods}");
        Ok(())
    }
}

/// One measured pod of each kind.
struct Sample {
    handler: String,
    pod: String,
    start: pods::Start,
    cri_at: std::time::SystemTime,
    cri: Duration,
    floor_run: Duration,
    floor_cni: Duration,
}

fn write_samples(path: &Path, samples: &[Sample]) -> anyhow::Result<()> {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let micros = |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_micros();
    let mut text =
        String::from("handler,pod,uid,created_at_us,create_ms,running_ms,failed,cri_only_at_us,cri_only_ms,floor_ms\n");
    for s in samples {
        text.push_str(&format!(
            "{},{},{},{},{:.3},{:.3},{},{},{:.3},{:.3}\n",
            s.handler,
            s.pod,
            s.start.uid,
            micros(s.start.at),
            ms(s.start.create),
            ms(s.start.took),
            matches!(s.start.ended, pods::Ended::Failed(_)),
            micros(s.cri_at),
            ms(s.cri),
            ms(s.floor_run + s.floor_cni)
        ));
    }
    std::fs::write(path, text)?;
    Ok(())
}
