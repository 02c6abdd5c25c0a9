//! The supervisor (`berth up --foreground`): runs the parts as child processes of the same
//! binary, restarts a crashed one with back-off, and stops them in order.
//!
//! | part | command | started when |
//! |---|---|---|
//! | runtime | `berth runtime --config D/runtime/runtime.toml` | at once |
//! | server | `berth server --data-dir D …` (scheduler and controllers in-process) | at once (not with `--join`) |
//! | agent | `berth agent --kubeconfig D/agent/node.kubeconfig …` | the runtime answered CRI, and the server `/readyz` (its RuntimeClasses created and the node's token made) |
//!
//! Each part logs to `D/logs/<part>.log`, runs in a process group of its own (a Ctrl-C reaches
//! only the supervisor) and gets SIGTERM from the kernel if the supervisor dies
//! (`--supervisor-pid`, see `main.rs`). A part that exits is started again after a back-off of
//! 1 s, doubling to 30 s, reset once it has run 60 s ([`Backoff`]). Only the processes started
//! here are ever signalled, by pid, and only while they are not yet reaped.
//!
//! SIGTERM, SIGINT or SIGHUP stop the cluster: agent, then server, then runtime, each with
//! SIGTERM and SIGKILL after a grace period; containers keep running. SIGUSR1 does the same
//! and, between agent and server, stops and removes every pod through CRI (`berth down
//! --stop-pods`). The state of every part goes to `D/up.json` on each change.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_cri::v1 as cri;
use rustix::process::Signal;
use tokio::sync::mpsc;

use super::cluster::{self, node_ready_since};
use super::discovery::Probe;
use super::health;
use super::layout::{Layout, Lock, PartState, PartStatus, State, write_atomically};

/// How long a part may take to stop after SIGTERM before it gets SIGKILL.
const GRACE: [(Name, Duration); 3] = [
    (Name::Agent, Duration::from_secs(15)),
    (Name::Server, Duration::from_secs(15)),
    (Name::Runtime, Duration::from_secs(30)),
];
/// How often a starting part is asked whether it is ready.
const READY_POLL: Duration = Duration::from_millis(200);

/// Restart delays: 1 s, doubling to 30 s; back to 1 s after a run of at least 60 s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backoff {
    next: Duration,
}

impl Backoff {
    pub const INITIAL: Duration = Duration::from_secs(1);
    pub const MAX: Duration = Duration::from_secs(30);
    pub const RESET_AFTER: Duration = Duration::from_secs(60);

    pub fn new() -> Backoff {
        Backoff { next: Self::INITIAL }
    }

    /// The delay before starting again a part that exited after running `ran_for`.
    pub fn delay_after(&mut self, ran_for: Duration) -> Duration {
        if ran_for >= Self::RESET_AFTER {
            self.next = Self::INITIAL;
        }
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        delay
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Name {
    Runtime,
    Server,
    Agent,
}

impl Name {
    pub fn as_str(self) -> &'static str {
        match self {
            Name::Runtime => "runtime",
            Name::Server => "server",
            Name::Agent => "agent",
        }
    }
}

/// What the supervisor runs, resolved by `berth up`.
/// The cluster DNS Service's address under `berth server`'s default Service range.
pub const CLUSTER_DNS: &str = "10.96.0.10";

#[derive(Clone, Debug)]
pub struct Plan {
    pub layout: Layout,
    /// The `berth` binary the parts are started from.
    pub exe: PathBuf,
    pub node_name: String,
    /// `--join`: no server here; `D/agent/node.kubeconfig` is already in place.
    pub join: bool,
    /// Flags of `berth server` after `--data-dir D`.
    pub server_args: Vec<String>,
    pub runtime_socket: PathBuf,
    pub agent_port: u16,
    pub probes: Vec<Probe>,
    /// The cluster's pod range (`--pod-cidr`), for the agent's egress masquerading.
    pub cluster_cidr: String,
}

impl Plan {
    /// The kubeconfig the supervisor and `berth status` reach the API with.
    pub fn api_kubeconfig(&self) -> PathBuf {
        if self.join { self.layout.node_kubeconfig() } else { self.layout.admin_kubeconfig() }
    }

    fn args(&self, name: Name) -> Vec<OsString> {
        let l = &self.layout;
        let mut args: Vec<OsString> = Vec::new();
        match name {
            Name::Runtime => {
                args.extend(["runtime".into(), "--config".into(), l.runtime_config().into_os_string()]);
            }
            Name::Server => {
                args.extend(["server".into(), "--data-dir".into(), l.data_dir.clone().into_os_string()]);
                args.extend(self.server_args.iter().map(OsString::from));
            }
            Name::Agent => {
                args.extend(["agent".into(), "--kubeconfig".into(), l.node_kubeconfig().into_os_string()]);
                args.extend(["--node-name".into(), self.node_name.clone().into()]);
                let endpoint = format!("container:berth:unix://{}", self.runtime_socket.display());
                args.extend(["--container-runtime-endpoint".into(), endpoint.into()]);
                args.extend(["--port".into(), self.agent_port.to_string().into()]);
                args.extend(["--root-dir".into(), l.agent_dir().into_os_string()]);
                args.extend(["--proxy-table".into(), l.proxy_table().into()]);
                // The server's default Service range puts its cluster DNS at this address.
                args.extend(["--cluster-dns".into(), CLUSTER_DNS.into()]);
                args.extend(["--cluster-cidr".into(), self.cluster_cidr.clone().into()]);
            }
        }
        args
    }
}

enum Run {
    Waiting,
    Running {
        pid: u32,
        since: Instant,
        started_at: jiff::Timestamp,
        signals: mpsc::UnboundedSender<Signal>,
        checker: tokio::task::JoinHandle<()>,
    },
    Restarting {
        at: Instant,
        at_time: jiff::Timestamp,
    },
    Stopped,
}

struct Part {
    name: Name,
    run: Run,
    restarts: u32,
    backoff: Backoff,
    /// Counts starts, so that events of an earlier process are told apart.
    generation: u64,
    last_exit: Option<String>,
    /// Ready at least once since the supervisor started.
    ever_ready: bool,
}

impl Part {
    /// After an exit (or a failed start): counted, and started again after the back-off.
    fn restart_later(&mut self, ran_for: Duration, status: String) {
        let delay = self.backoff.delay_after(ran_for);
        self.restarts += 1;
        tracing::warn!(part = self.name.as_str(), %status, restart_in = ?delay, "exited; starting it again after back-off");
        self.last_exit = Some(status);
        self.run = Run::Restarting {
            at: Instant::now() + delay,
            at_time: jiff::Timestamp::now() + jiff::SignedDuration::try_from(delay).unwrap_or_default(),
        };
    }
}

enum Event {
    Exited { part: Name, generation: u64, status: String },
    Ready { part: Name, generation: u64 },
}

struct Supervisor {
    plan: Plan,
    parts: Vec<Part>,
    events: mpsc::UnboundedSender<Event>,
    started_at: jiff::Timestamp,
    /// Classes created and node credentials made, after the server's first `/readyz`.
    prepared: bool,
    node_ready: bool,
    announced: bool,
}

/// Runs the cluster until a stop signal; `Ok` also when another supervisor already runs.
pub async fn supervise(plan: Plan) -> anyhow::Result<()> {
    let layout = plan.layout.clone();
    std::fs::create_dir_all(layout.logs_dir())
        .with_context(|| format!("cannot create {}", layout.logs_dir().display()))?;
    let Some(lock) = Lock::try_acquire(&layout)? else {
        println!("berth is already up in {}; nothing changed", layout.data_dir.display());
        return Ok(());
    };
    let pid = std::process::id();
    write_atomically(&layout.pidfile(), format!("{pid}\n").as_bytes())
        .with_context(|| format!("cannot write {}", layout.pidfile().display()))?;
    tracing::info!(pid, data_dir = %layout.data_dir.display(), node = %plan.node_name, "berth up: supervising");

    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    let mut usr1 = signal(SignalKind::user_defined1()).context("SIGUSR1 handler")?;

    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut names = vec![Name::Runtime];
    if !plan.join {
        names.push(Name::Server);
    }
    names.push(Name::Agent);
    let parts = names
        .into_iter()
        .map(|name| Part {
            name,
            run: Run::Waiting,
            restarts: 0,
            backoff: Backoff::new(),
            generation: 0,
            last_exit: None,
            ever_ready: false,
        })
        .collect();
    let mut sup = Supervisor {
        plan,
        parts,
        events: tx,
        started_at: jiff::Timestamp::now(),
        prepared: false,
        node_ready: false,
        announced: false,
    };
    sup.start(Name::Runtime);
    if !sup.plan.join {
        sup.start(Name::Server);
    }

    let stop_pods = loop {
        sup.prepare_agent().await;
        sup.write_state(true);
        let next = sup.next_restart();
        tokio::select! {
            Some(event) = rx.recv() => sup.handle(event),
            _ = tokio::time::sleep_until(next.unwrap_or_else(Instant::now).into()), if next.is_some() => sup.restart_due(),
            _ = term.recv() => break false,
            _ = int.recv() => break false,
            _ = hup.recv() => break false,
            _ = usr1.recv() => break true,
        }
    };
    tracing::info!(stop_pods, "berth up: stopping the cluster");
    sup.shutdown(stop_pods, &mut rx).await;
    sup.write_state(false);
    let _ = std::fs::remove_file(layout.pidfile());
    drop(lock);
    tracing::info!("berth up: stopped");
    Ok(())
}

impl Supervisor {
    fn part(&mut self, name: Name) -> &mut Part {
        self.parts.iter_mut().find(|p| p.name == name).expect("every part is in the list")
    }

    fn has(&self, name: Name) -> bool {
        self.parts.iter().any(|p| p.name == name)
    }

    fn ever_ready(&self, name: Name) -> bool {
        self.parts.iter().any(|p| p.name == name && p.ever_ready)
    }

    /// Starts a part's process (or schedules a retry if it cannot be started).
    fn start(&mut self, name: Name) {
        let args = self.plan.args(name);
        let log_path = self.plan.layout.log(name.as_str());
        let exe = self.plan.exe.clone();
        let events = self.events.clone();
        let checker_ctx = Checker { plan: self.plan.clone(), events: self.events.clone() };
        let part = self.part(name);
        part.generation += 1;
        let generation = part.generation;
        let spawned = spawn(&exe, &args, &log_path);
        match spawned {
            Ok(child) => {
                let pid = child.id().unwrap_or_default();
                let (signals, signal_rx) = mpsc::unbounded_channel();
                tokio::spawn(watch_child(child, name, generation, signal_rx, events));
                let started_at = jiff::Timestamp::now();
                let checker = tokio::spawn(checker_ctx.wait_ready(name, generation, started_at));
                part.run = Run::Running { pid, since: Instant::now(), started_at, signals, checker };
                tracing::info!(part = name.as_str(), pid, log = %log_path.display(), "started");
            }
            Err(e) => {
                let status = format!("cannot start: {e:#}");
                part.restart_later(Duration::ZERO, status);
            }
        }
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Exited { part: name, generation, status } => {
                let part = self.part(name);
                if part.generation != generation {
                    return;
                }
                let Run::Running { since, checker, .. } = &part.run else { return };
                checker.abort();
                let ran_for = since.elapsed();
                part.restart_later(ran_for, status);
                if name == Name::Agent {
                    self.node_ready = false;
                }
            }
            Event::Ready { part: name, generation } => {
                let part = self.part(name);
                if part.generation != generation || !matches!(part.run, Run::Running { .. }) {
                    return;
                }
                part.ever_ready = true;
                tracing::info!(part = name.as_str(), "ready");
                if name == Name::Agent {
                    self.node_ready = true;
                    if !self.announced {
                        self.announced = true;
                        let plan = self.plan.clone();
                        tokio::spawn(async move { super::announce(&plan, std::process::id()).await });
                    }
                }
            }
        }
    }

    /// Once the runtime answers and (unless joining) the server is ready: RuntimeClasses,
    /// node credentials, then the agent.
    async fn prepare_agent(&mut self) {
        if !self.has(Name::Agent) || !matches!(self.part(Name::Agent).run, Run::Waiting) {
            return;
        }
        if !self.plan.join && !self.prepared && self.ever_ready(Name::Server) {
            self.prepared = true;
            if let Err(e) = self.prepare_cluster().await {
                tracing::error!(error = format!("{e:#}"), "preparing the cluster for the agent failed");
            }
        }
        if self.ever_ready(Name::Runtime) && (self.plan.join || self.prepared) {
            self.start(Name::Agent);
        }
    }

    async fn prepare_cluster(&self) -> anyhow::Result<()> {
        let layout = &self.plan.layout;
        let client = cluster::client(&layout.admin_kubeconfig()).await?;
        let mut attempt = 0;
        loop {
            match cluster::ensure_classes(&client, &self.plan.probes).await {
                Ok(created) => {
                    tracing::info!(?created, "RuntimeClasses for the runtimes that work here");
                    break;
                }
                Err(e) if attempt < 10 => {
                    tracing::warn!(error = format!("{e:#}"), "creating RuntimeClasses; trying again");
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e),
            }
        }
        ensure_node_kubeconfig(layout, &self.plan.node_name)
    }

    fn next_restart(&self) -> Option<Instant> {
        self.parts
            .iter()
            .filter_map(|p| match p.run {
                Run::Restarting { at, .. } => Some(at),
                _ => None,
            })
            .min()
    }

    fn restart_due(&mut self) {
        let now = Instant::now();
        let due: Vec<Name> = self
            .parts
            .iter()
            .filter(|p| matches!(p.run, Run::Restarting { at, .. } if at <= now))
            .map(|p| p.name)
            .collect();
        for name in due {
            self.start(name);
        }
    }

    /// Agent, (pods), server, runtime: each SIGTERMed and awaited, SIGKILLed after its grace.
    async fn shutdown(&mut self, stop_pods: bool, events: &mut mpsc::UnboundedReceiver<Event>) {
        for p in &mut self.parts {
            if matches!(p.run, Run::Waiting | Run::Restarting { .. }) {
                p.run = Run::Stopped;
            }
        }
        for (name, grace) in GRACE {
            if name == Name::Server && stop_pods {
                self.stop_pods().await;
            }
            if self.has(name) {
                self.stop(name, grace, events).await;
            }
        }
    }

    async fn stop(&mut self, name: Name, grace: Duration, events: &mut mpsc::UnboundedReceiver<Event>) {
        for signal in [Signal::TERM, Signal::KILL] {
            let Run::Running { signals, .. } = &self.part(name).run else { return };
            let _ = signals.send(signal);
            let deadline = tokio::time::Instant::now()
                + if signal == Signal::TERM { grace } else { grace.max(Duration::from_secs(10)) };
            while matches!(self.part(name).run, Run::Running { .. }) {
                match tokio::time::timeout_at(deadline, events.recv()).await {
                    Ok(Some(Event::Exited { part, generation, status })) => {
                        let p = self.part(part);
                        if p.generation == generation
                            && let Run::Running { checker, .. } = &p.run
                        {
                            checker.abort();
                            p.last_exit = Some(status.clone());
                            p.run = Run::Stopped;
                            tracing::info!(part = part.as_str(), %status, "stopped");
                        }
                    }
                    Ok(Some(Event::Ready { .. })) => {}
                    Ok(None) | Err(_) => break,
                }
                self.write_state(true);
            }
            if !matches!(self.part(name).run, Run::Running { .. }) {
                return;
            }
            tracing::warn!(part = name.as_str(), "did not stop in time; killing it");
        }
    }

    /// Stops and removes every pod sandbox the runtime holds (their containers with them).
    async fn stop_pods(&mut self) {
        if !matches!(self.part(Name::Runtime).run, Run::Running { .. }) {
            tracing::warn!("the runtime is not running: its pods cannot be stopped");
            return;
        }
        match remove_every_pod(&self.plan.runtime_socket).await {
            Ok(n) => tracing::info!(pods = n, "stopped and removed every pod"),
            Err(e) => tracing::error!(error = format!("{e:#}"), "stopping the pods failed"),
        }
    }

    fn write_state(&self, running: bool) {
        let layout = &self.plan.layout;
        let parts = self
            .parts
            .iter()
            .map(|p| {
                let (state, pid, since) = match &p.run {
                    Run::Waiting => (PartState::Waiting, None, None),
                    Run::Running { pid, started_at, .. } => (PartState::Running, Some(*pid), Some(*started_at)),
                    Run::Restarting { at_time, .. } => (PartState::Restarting, None, Some(*at_time)),
                    Run::Stopped => (PartState::Stopped, None, None),
                };
                PartStatus {
                    name: p.name.as_str().into(),
                    state,
                    pid,
                    restarts: p.restarts,
                    since,
                    last_exit: p.last_exit.clone(),
                    log: layout.log(p.name.as_str()),
                }
            })
            .collect();
        let state = State {
            supervisor_pid: std::process::id(),
            started_at: self.started_at,
            running,
            node_name: self.plan.node_name.clone(),
            join: self.plan.join,
            kubeconfig: self.plan.api_kubeconfig(),
            runtime_socket: self.plan.runtime_socket.clone(),
            agent_port: self.plan.agent_port,
            node_ready: self.node_ready,
            parts,
            runtimes: self.plan.probes.clone(),
        };
        if let Err(e) = state.write(layout) {
            tracing::warn!(error = %e, "cannot write the state file");
        }
    }
}

/// Starts `exe args` with output appended to `log`, in a process group of its own, told to
/// die with this process.
/// Stops and removes every pod sandbox (its containers with it) of the runtime on `socket`;
/// returns how many there were.
pub async fn remove_every_pod(socket: &Path) -> anyhow::Result<usize> {
    let endpoint = format!("unix://{}", socket.display());
    let ctx = crate::commands::cri::Context::new(&endpoint, Duration::from_secs(60));
    let mut runtime = ctx.runtime().await?;
    let pods = runtime.list_pod_sandbox(ctx.request(cri::ListPodSandboxRequest { filter: None })).await?;
    let mut removed = 0;
    for pod in pods.into_inner().items {
        let id = pod.id;
        runtime.stop_pod_sandbox(ctx.request(cri::StopPodSandboxRequest { pod_sandbox_id: id.clone() })).await?;
        runtime.remove_pod_sandbox(ctx.request(cri::RemovePodSandboxRequest { pod_sandbox_id: id.clone() })).await?;
        removed += 1;
    }
    Ok(removed)
}

pub fn spawn(exe: &Path, args: &[OsString], log: &Path) -> anyhow::Result<tokio::process::Child> {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open {}", log.display()))?;
    let _ = writeln!(file, "=== {} berth up starts: berth {}", jiff::Timestamp::now(), shell_words(args));
    let err = file.try_clone().context("cannot share the log file")?;
    let child = tokio::process::Command::new(exe)
        .arg("--supervisor-pid")
        .arg(std::process::id().to_string())
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(file)
        .stderr(err)
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {}", exe.display()))?;
    Ok(child)
}

fn shell_words(args: &[OsString]) -> String {
    args.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ")
}

/// Owns a child: reports its exit, and signals it on request while it is not yet reaped (so its
/// pid cannot belong to another process).
async fn watch_child(
    mut child: tokio::process::Child,
    part: Name,
    generation: u64,
    mut signals: mpsc::UnboundedReceiver<Signal>,
    events: mpsc::UnboundedSender<Event>,
) {
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = match status {
                    Ok(s) => s.to_string(),
                    Err(e) => format!("wait failed: {e}"),
                };
                let _ = events.send(Event::Exited { part, generation, status });
                return;
            }
            Some(signal) = signals.recv() => {
                if let Some(pid) = child.id().and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
                    let _ = rustix::process::kill_process(pid, signal);
                }
            }
        }
    }
}

/// What a readiness check needs.
struct Checker {
    plan: Plan,
    events: mpsc::UnboundedSender<Event>,
}

impl Checker {
    /// Polls until the part is ready, then reports it once.
    async fn wait_ready(self, name: Name, generation: u64, started_at: jiff::Timestamp) {
        loop {
            let ready = match name {
                Name::Runtime => health::runtime_status(&self.plan.runtime_socket).await.is_ok(),
                Name::Server => health::server_readyz(&self.plan.layout.admin_kubeconfig()).await.is_ok(),
                Name::Agent => match cluster::client(&self.plan.api_kubeconfig()).await {
                    Ok(client) => node_ready_since(&client, &self.plan.node_name, started_at).await.is_some(),
                    Err(_) => false,
                },
            };
            if ready {
                let _ = self.events.send(Event::Ready { part: name, generation });
                return;
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }
}

/// `D/agent/node.kubeconfig` for `node`, made with a new node token unless one for this node
/// and this server is there.
pub fn ensure_node_kubeconfig(layout: &Layout, node: &str) -> anyhow::Result<()> {
    let path = layout.node_kubeconfig();
    let admin = crate::commands::server::admin_cluster(&layout.data_dir)?;
    if let Ok(text) = std::fs::read_to_string(&path) {
        let same_node = cluster::node_of_kubeconfig(&text).is_ok_and(|n| n == node);
        let config: Option<serde_json::Value> = serde_yaml::from_str(&text).ok();
        let same_server = config.as_ref().and_then(|c| c.pointer("/clusters/0/cluster")) == Some(&admin);
        if same_node && same_server {
            return Ok(());
        }
    }
    let text = crate::commands::server::node_kubeconfig(&layout.data_dir, node)?;
    write_private(&path, text.as_bytes())
}

/// Writes a file only root may read (credentials), its directory created first.
pub fn write_private(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    berth_common::fs::write_atomic(path, data, 0o600)
        .map_err(|e| e.source)
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_one_second_to_thirty() {
        let mut b = Backoff::new();
        let quick = Duration::from_secs(1);
        let delays: Vec<u64> = (0..7).map(|_| b.delay_after(quick).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30]);
    }

    #[test]
    fn backoff_starts_over_after_a_minute_of_running() {
        let mut b = Backoff::new();
        for _ in 0..4 {
            b.delay_after(Duration::from_secs(2));
        }
        assert_eq!(b.delay_after(Duration::from_secs(59)), Duration::from_secs(16));
        assert_eq!(b.delay_after(Duration::from_secs(60)), Duration::from_secs(1));
        assert_eq!(b.delay_after(Duration::from_secs(3)), Duration::from_secs(2));
    }

    #[test]
    fn the_agent_runs_against_the_runtimes_socket_as_the_node() {
        let plan = Plan {
            layout: Layout::new(Path::new("/d")).unwrap(),
            exe: "/usr/local/bin/berth".into(),
            node_name: "n1".into(),
            join: false,
            server_args: vec!["--secure-port".into(), "7443".into()],
            runtime_socket: "/run/x.sock".into(),
            agent_port: 10251,
            probes: vec![],
            cluster_cidr: "10.244.0.0/16".into(),
        };
        let words = |name| shell_words(&plan.args(name));
        assert_eq!(words(Name::Runtime), "runtime --config /d/runtime/runtime.toml");
        assert_eq!(words(Name::Server), "server --data-dir /d --secure-port 7443");
        assert_eq!(
            words(Name::Agent),
            "agent --kubeconfig /d/agent/node.kubeconfig --node-name n1 --container-runtime-endpoint \
             container:berth:unix:///run/x.sock --port 10251 --root-dir /d/agent --proxy-table berth-b49cd0ae \
             --cluster-dns 10.96.0.10 --cluster-cidr 10.244.0.0/16"
        );
        assert_eq!(plan.api_kubeconfig(), Path::new("/d/admin.kubeconfig"));
    }
}
