//! `berth-bench cri`: pod lifecycle latencies of berth's CRI runtime per handler (runc, crun,
//! gVisor), next to the floor (the raw OCI runtime plus CNI) and to containerd 1.6, all measured in
//! the same run; and the resident memory of the runtime and its per-container monitor.
//!
//! The bench starts everything it measures: a loopback registry holding busybox and pause, the
//! release `berth runtime` (found next to this binary) and containerd, each with its own state dir,
//! socket and bridge. For each handler it repeats, pod by pod, one floor sample, one berth pod and
//! one containerd pod, so that the three see the same machine load. A pod is RunPodSandbox,
//! CreateContainer + StartContainer of `true`, polling ContainerStatus until it has exited, Stop +
//! RemoveContainer, Stop + RemovePodSandbox, all from one client.
//!
//! Figures are printed (and written as JSON with `--json`), never asserted. Everything started is
//! stopped and removed again, also when a step fails.

pub mod client;
pub mod daemons;
pub mod floor;
pub mod net;
mod report;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use berth_testenv::containerd::SANDBOX_IMAGE;
use berth_testenv::images::{Format, busybox_symlinked_image};
use berth_testenv::{Containerd, Registry};

use self::client::{CriClient, PodSpec, Sample};
use self::daemons::Daemon;
use self::net::{CniFloor, HostState};
use self::report::{FloorFigures, HandlerResult, Memory, Phases, Report};

pub const HANDLERS: [&str; 3] = ["runc", "crun", "gvisor"];

#[derive(clap::Args)]
pub struct CriArgs {
    /// Pods per handler and runtime (and floor samples per handler).
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// Pods for gvisor, whose containers take ~100+ ms each to start; at most --pods.
    #[arg(long, default_value_t = 20)]
    gvisor_pods: usize,
    /// Handlers to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "runc,crun,gvisor")]
    handlers: Vec<String>,
    /// Unrecorded pods (and floor samples) per handler and runtime before the measured ones.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// The `berth` binary (with `berth-monitor` next to it); default: next to this binary.
    #[arg(long)]
    berth_binary: Option<PathBuf>,
    #[arg(long, default_value = "/usr/bin/containerd")]
    containerd: PathBuf,
    /// Also write the figures here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

impl CriArgs {
    fn pods_for(&self, handler: &str) -> usize {
        if handler == "gvisor" { self.pods.min(self.gvisor_pods) } else { self.pods }
    }
}

/// A loopback registry holding busybox and pause:3.9, for berth and containerd alike; and the
/// busybox reference.
pub async fn registry_with_busybox_and_pause() -> anyhow::Result<(Registry, String)> {
    eprintln!("starting docker-registry on loopback, pushing busybox and pause:3.9");
    let registry = Registry::start();
    // Symlinked applets: containerd leaves testenv's hard-linked busybox not executable.
    let busybox = tokio::task::spawn_blocking(|| busybox_symlinked_image(Format::Oci)).await?;
    registry.push_image("busybox", "latest", &busybox).await;
    registry.push_pause().await;
    let image = registry.reference("busybox:latest");
    Ok((registry, image))
}

/// Fails on a handler the benchmarks do not know.
pub fn check_handlers(handlers: &[String]) -> anyhow::Result<()> {
    for h in handlers {
        ensure!(HANDLERS.contains(&h.as_str()), "unknown handler {h:?}; known: {}", HANDLERS.join(", "));
    }
    Ok(())
}

/// `berth` next to this binary, else in the release dir beside this profile's.
pub fn default_berth_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("the bench binary's directory")?;
    let candidates = [dir.join("berth"), dir.join("../release/berth")];
    Ok(candidates.iter().find(|p| p.exists()).unwrap_or(&candidates[0]).clone())
}

/// A runtime's process: berth's own under the bench's watchdog, or testenv's containerd.
enum Process {
    Berth(Daemon),
    Containerd(Containerd),
}

impl Process {
    fn pid(&self) -> u32 {
        match self {
            Process::Berth(d) => d.pid,
            Process::Containerd(c) => c.pid(),
        }
    }

    fn log_tail(&self) -> String {
        match self {
            Process::Berth(d) => d.log_tail(),
            Process::Containerd(c) => c.log_tail(20),
        }
    }

    fn stop(&mut self) {
        match self {
            Process::Berth(d) => d.stop(),
            Process::Containerd(c) => c.stop(),
        }
    }
}

/// One runtime under test: its process and a client.
struct Runtime {
    daemon: Process,
    client: CriClient,
    version: String,
}

impl Runtime {
    async fn connect(daemon: Process, socket: &Path, what: &str) -> anyhow::Result<Self> {
        let mut client = match CriClient::wait_ready(socket, Duration::from_secs(30)).await {
            Ok(c) => c,
            Err(e) => bail!("{what} did not become ready: {e:#}\n{}", daemon.log_tail()),
        };
        let version = client.version().await?;
        Ok(Self { daemon, client, version })
    }

    /// Removes every pod, then stops the process.
    async fn shut_down(mut self, what: &str) {
        match self.client.remove_all().await {
            Ok(0) => {}
            Ok(n) => eprintln!("removed {n} pod(s) left in {what}"),
            Err(e) => eprintln!("removing the pods left in {what} failed: {e:#}"),
        }
        self.daemon.stop();
    }
}

/// What the run set up, torn down in reverse whatever happened in between.
struct Session {
    dir: tempfile::TempDir,
    berth: Option<Runtime>,
    containerd: Option<Runtime>,
}

impl Session {
    async fn tear_down(mut self) {
        if let Some(r) = self.berth.take() {
            r.shut_down("berth").await;
        }
        if let Some(r) = self.containerd.take() {
            r.shut_down("containerd").await;
        }
        daemons::unmount_under(self.dir.path());
    }
}

pub async fn run(args: CriArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    ensure!(args.pods > 0 && args.gvisor_pods > 0, "--pods and --gvisor-pods must be positive");
    ensure!(!args.handlers.is_empty(), "--handlers names none");
    check_handlers(&args.handlers)?;
    let berth_binary = match &args.berth_binary {
        Some(p) => p.clone(),
        None => default_berth_binary()?,
    };
    let host = HostState::take(&[&daemons::BERTH_NETWORK, &daemons::CONTAINERD_NETWORK])?;
    let dir = tempfile::Builder::new().prefix("berth-bench-cri.").tempdir()?;
    eprintln!("run directory {}", dir.path().display());
    let mut session = Session { dir, berth: None, containerd: None };
    let result = measure(&args, &berth_binary, &mut session).await;
    session.tear_down().await;
    drop(host);
    let report = result?;
    report.print();
    crate::finish_run(args.json.as_deref(), || report.to_json(), started)
}

async fn measure(args: &CriArgs, berth_binary: &Path, session: &mut Session) -> anyhow::Result<Report> {
    let root = session.dir.path().to_owned();
    let (registry, image) = registry_with_busybox_and_pause().await?;
    // The floor first: its helpers panic on a broken host, before any runtime holds pods.
    let floor_dir = root.join("floor");
    let bundle = floor::write_bundle(&floor_dir)?;
    let floor_conflist = net::conflist(&daemons::BERTH_NETWORK, &floor_dir.join("ipam"));
    let cni = CniFloor::new(&floor_conflist)?;

    eprintln!("starting berth runtime ({})", berth_binary.display());
    let berth_dir = root.join("berth");
    std::fs::create_dir_all(&berth_dir)?;
    let (daemon, socket) = daemons::start_berth(berth_binary, &berth_dir, registry.host())?;
    let berth = session.berth.insert(Runtime::connect(Process::Berth(daemon), &socket, "berth runtime").await?);

    eprintln!("starting containerd ({})", args.containerd.display());
    let (binary, host) = (args.containerd.clone(), registry.host().to_owned());
    let ctd = tokio::task::spawn_blocking(move || {
        Containerd::builder()
            .binary(binary)
            .registry(&host)
            .network(daemons::CONTAINERD_NETWORK.bridge_network())
            .start()
    })
    .await
    .context("starting containerd")?;
    let socket = ctd.socket();
    let containerd =
        session.containerd.insert(Runtime::connect(Process::Containerd(ctd), &socket, "containerd").await?);

    containerd.client.pull(SANDBOX_IMAGE, "").await?;
    containerd.client.pull(&image, "").await?;
    for handler in &args.handlers {
        berth.client.pull(&image, handler).await?;
    }

    let mut results = Vec::new();
    for handler in &args.handlers {
        let n = args.pods_for(handler);
        eprintln!("{handler}: {} warm-up + {n} pods each for floor, berth and containerd", args.warmup);
        let berth_logs = client::log_dir(&root, "berth", handler)?;
        let ctd_logs = client::log_dir(&root, "containerd", handler)?;
        let mut result = HandlerResult::new(handler, n);
        for i in 0..args.warmup + n {
            let record = i >= args.warmup;
            let tag = if record { format!("{}", i - args.warmup) } else { format!("w{i}") };

            let id = format!("bench-floor-{handler}-{tag}");
            let (run, cni_time) =
                tokio::task::block_in_place(|| floor::sample(handler, &floor_dir, &bundle, &cni, &id))?;
            let pod = PodSpec::exiting(format!("berth-{handler}-{tag}"), handler, &berth_logs, &image);
            let b = berth.client.lifecycle(&pod).await.with_context(|| format!("berth, {handler}, pod {tag}"))?;
            let pod = PodSpec::exiting(format!("ctd-{handler}-{tag}"), handler, &ctd_logs, &image);
            let c =
                containerd.client.lifecycle(&pod).await.with_context(|| format!("containerd, {handler}, pod {tag}"))?;
            if record {
                result.floor.record(run, cni_time);
                result.berth.record(&b);
                result.containerd.record(&c);
            }
        }
        results.push(result);
    }
    drop(cni);

    eprintln!("memory: idle runtimes, then one running runc pod in each");
    let memory = measure_memory(berth, containerd, &image, &root).await;
    drop(registry);

    Ok(Report {
        pods: args.pods,
        gvisor_pods: args.pods_for("gvisor"),
        gvisor_measured: args.handlers.iter().any(|h| h == "gvisor"),
        warmup: args.warmup,
        image,
        berth_version: berth.version.clone(),
        containerd_version: containerd.version.clone(),
        floor_plugins: net::plugin_types(&floor_conflist),
        handlers: results,
        memory,
    })
}

/// Idle RSS of both runtimes after the runs; then, with one `sleep` pod running under runc in
/// each: berth's container monitor and infra process, containerd and its shim.
async fn measure_memory(berth: &mut Runtime, containerd: &mut Runtime, image: &str, root: &Path) -> Memory {
    let mut memory = Memory::default();
    // Idle: no RPC for a few seconds. Both settle (exit watchers, GC of the last pod, berth's
    // heap trim a second after the last RPC) before the figures are read.
    tokio::time::sleep(Duration::from_secs(3)).await;
    memory.berth_idle_kib = warn(client::rss_kib(berth.daemon.pid()), "berth runtime RSS");
    if let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", berth.daemon.pid())) {
        // File-backed pages are the binary's text, shared by every berth process.
        let parts: Vec<String> = status
            .lines()
            .filter(|l| l.starts_with("RssAnon") || l.starts_with("RssFile"))
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        eprintln!("berth runtime idle: {}", parts.join(", "));
    }
    memory.containerd_idle_kib = warn(client::rss_kib(containerd.daemon.pid()), "containerd RSS");

    let berth_one = async {
        let logs = client::log_dir(root, "berth", "memory")?;
        let pod = PodSpec::sleeping("berth-memory".into(), "runc", &logs, image);
        let (sandbox, id) = berth.client.start_long_running(&pod).await?;
        let info = berth.client.container_info(&id).await?;
        let monitor = client::rss_kib(client::pid_field(&info, "monitorPid")?)?;
        let infra = client::pid_field(&berth.client.sandbox_info(&sandbox).await?, "pid").and_then(client::rss_kib);
        anyhow::Ok((monitor, infra.ok()))
    };
    match berth_one.await {
        Ok((monitor, infra)) => {
            memory.monitor_kib = Some(monitor);
            memory.infra_kib = infra;
        }
        Err(e) => eprintln!("berth monitor RSS: {e:#}"),
    }
    let containerd_one = async {
        let logs = client::log_dir(root, "containerd", "memory")?;
        let pod = PodSpec::sleeping("ctd-memory".into(), "runc", &logs, image);
        let (_, id) = containerd.client.start_long_running(&pod).await?;
        let pid = client::pid_field(&containerd.client.container_info(&id).await?, "pid")?;
        let shim = client::parent_pid(pid)?;
        let name = client::comm(shim);
        ensure!(name.starts_with("containerd-shim"), "the container's parent is {name:?}, not a shim");
        anyhow::Ok((client::rss_kib(shim)?, name))
    };
    match containerd_one.await {
        Ok((shim, name)) => {
            memory.shim_kib = Some(shim);
            memory.shim_name = name;
        }
        Err(e) => eprintln!("containerd shim RSS: {e:#}"),
    }
    memory.berth_busy_kib = warn(client::rss_kib(berth.daemon.pid()), "berth runtime RSS");
    memory.containerd_busy_kib = warn(client::rss_kib(containerd.daemon.pid()), "containerd RSS");
    for (what, runtime) in [("berth", &mut *berth), ("containerd", &mut *containerd)] {
        if let Err(e) = runtime.client.remove_all().await {
            eprintln!("removing the memory pod from {what}: {e:#}");
        }
    }
    memory
}

/// A figure that failed is reported missing rather than failing the run.
fn warn<T>(r: anyhow::Result<T>, what: &str) -> Option<T> {
    r.map_err(|e| eprintln!("{what}: {e:#}")).ok()
}

impl Phases {
    fn record(&mut self, s: &Sample) {
        self.run_pod.record(s.run_pod);
        self.create_start.record(s.create_start);
        self.wait_exit.record(s.wait_exit);
        self.stop_remove_container.record(s.stop_remove_container);
        self.stop_container.record(s.stop_container);
        self.stop_remove_pod.record(s.stop_remove_pod);
        self.lifecycle.record(s.lifecycle);
    }
}

impl FloorFigures {
    fn record(&mut self, run: Duration, cni: Duration) {
        self.run.record(run);
        self.cni.record(cni);
        self.total.record(run + cni);
    }
}
