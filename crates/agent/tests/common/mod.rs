//! Test harness for the agent: the real `berth` binary as `berth server` (temp data dir, free
//! port), `berth runtime` (temp socket and root, handlers runc, crun and gvisor by default, a
//! CNI network of its own) and `berth agent` (a config file the test rewrites), each killed on
//! drop, with their logs printed when a test fails. Images come from `berth_testenv::Registry`
//! (a loopback registry): give its host to [`RuntimeBuilder::insecure_registry`].
//!
//! ```no_run
//! # async fn demo() {
//! let server = common::Server::start();
//! let runtime = common::Runtime::start();
//! let agent = common::Agent::start(&server, "node-a", &common::agent_toml(&[("berth", &runtime)], false));
//! let node = common::eventually("the node", || async { server.node("node-a").await }).await;
//! # }
//! ```
//!
//! containerd is `berth_testenv::Containerd`; [`containerd_endpoint_toml`] adds it to an agent
//! config, [`node_kubeconfig`] makes a node's own kubeconfig, and [`cri_client`] asks any
//! runtime directly what it holds. [`RuntimeBuilder::in_netns`] and [`Agent::start_in_netns`] run
//! a node in a network namespace of its own ([`command_in`]).
//!
//! The `berth` and `berth-monitor` binaries are built (incrementally) into this test's target
//! directory on first use, or taken from `$BERTH_BIN`.
#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_openapi::api::core::v1::Node;

/// How long [`eventually`] waits by default: a debug build on a busy 2-core machine.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// `target/<profile>` of this test binary (`target/<profile>/deps/<test>`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>").to_path_buf()
}

/// The `berth` binary: `$BERTH_BIN`, else built with cargo into this test's target dir (once per
/// test process; a failed build fails every test that asks, without building again), together
/// with `berth-monitor` beside it, where `berth runtime` looks for it.
pub fn berth_binary() -> &'static Path {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let bin = BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("BERTH_BIN") {
            return Ok(bin.into());
        }
        let profile = profile_dir();
        let target_dir = profile.parent().expect("a profile dir lives in a target dir");
        let mut cargo = Command::new(env!("CARGO"));
        cargo
            .args(["build", "-q", "-p", "berth", "-p", "berth-monitor"])
            .args(["--bin", "berth", "--bin", "berth-monitor", "--target-dir"])
            .arg(target_dir);
        if profile.file_name().is_some_and(|n| n == "release") {
            cargo.arg("--release");
        }
        let status =
            cargo.current_dir(env!("CARGO_MANIFEST_DIR")).status().map_err(|e| format!("running cargo: {e}"))?;
        if !status.success() {
            return Err(format!("building berth failed ({status})"));
        }
        let bin = profile.join("berth");
        if !bin.is_file() {
            return Err(format!("no berth binary in {}", profile.display()));
        }
        Ok(bin)
    });
    bin.as_deref().unwrap_or_else(|e| panic!("{e}"))
}

/// `program` as a command, run in the network namespace `netns` (`/run/netns/NAME`, as `ip netns
/// add` makes) when given. `nsenter --net` rather than `ip netns exec`: only the network
/// namespace changes, so the mounts a runtime or an agent makes (pod volumes, rootfs, sandbox
/// namespaces) stay visible to the other processes and to the test. nsenter execs `program`, so
/// the child's pid is the program's own.
pub fn command_in(netns: Option<&str>, program: impl AsRef<std::ffi::OsStr>) -> Command {
    match netns {
        Some(netns) => {
            let mut command = Command::new("nsenter");
            command.arg(format!("--net=/run/netns/{netns}")).arg(program);
            command
        }
        None => Command::new(program),
    }
}

/// A port free on every address: servers bound to loopback also listen on the host's address,
/// and agents on all of them.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0").unwrap().local_addr().unwrap().port()
}

/// Polls `f` until it returns `Some`, for at most [`PATIENCE`].
pub async fn eventually<T, F, Fut>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_within(PATIENCE, what, f).await
}

pub async fn eventually_within<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A child process with its log file; SIGKILLed on drop, its log printed if the test panicked.
struct Process {
    what: &'static str,
    child: Option<Child>,
    log: PathBuf,
}

impl Process {
    fn spawn(what: &'static str, mut command: Command, log: PathBuf) -> Process {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"));
        Process { what, child: Some(child), log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn check_alive(&mut self) {
        if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
            panic!("{} exited with {status}:\n{}", self.what, self.log());
        }
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn signal(&self, signal: &str) {
        let pid = self.pid().unwrap_or_else(|| panic!("{} is not running", self.what));
        assert!(Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).status().unwrap().success());
    }

    /// SIGTERM, then waits for the exit.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let _ = child.wait();
        }
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- {} log ({}) ---\n{}", self.what, self.log.display(), self.log());
        }
        self.kill9();
    }
}

/// `berth server` on a free port with a temp data dir.
pub struct Server {
    process: Process,
    pub dir: tempfile::TempDir,
    pub port: u16,
    extra: Vec<String>,
}

impl Server {
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// With extra flags after the harness's own (e.g. `--no-scheduler`).
    pub fn start_with(extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let process = Server::spawn(&dir, port, &extra);
        let mut server = Server { process, dir, port, extra };
        server.wait_ready();
        server
    }

    fn spawn(dir: &tempfile::TempDir, port: u16, extra: &[String]) -> Process {
        let mut command = Command::new(berth_binary());
        command
            .args(["server", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--secure-port", &port.to_string(), "--compaction-interval-seconds", "3600"])
            .args(extra);
        Process::spawn("berth server", command, dir.path().join("server.log"))
    }

    /// Ready, and (when its controllers run) with the `default` ServiceAccount the
    /// ServiceAccount admission plugin wants for every pod of the `default` namespace.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let controllers = !self.extra.iter().any(|a| a.starts_with("--controllers"));
        let mut ready = false;
        loop {
            self.process.check_alive();
            ready =
                ready || (self.kubeconfig().exists() && self.kubectl(&["get", "--raw", "/readyz"]).status.success());
            if ready && (!controllers || self.kubectl(&["get", "serviceaccount", "default"]).status.success()) {
                return;
            }
            assert!(Instant::now() < deadline, "berth server not ready:\n{}", self.process.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL, as a crash, then a start on the same data dir and port.
    pub fn crash_and_restart(&mut self) {
        self.process.kill9();
        self.process = Server::spawn(&self.dir, self.port, &self.extra);
        self.wait_ready();
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The admin kubeconfig the server writes.
    pub fn kubeconfig(&self) -> PathBuf {
        self.data_dir().join("admin.kubeconfig")
    }

    pub fn log(&self) -> String {
        self.process.log()
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl").env("KUBECONFIG", self.kubeconfig()).args(args).output().expect("running kubectl")
    }

    /// kubectl, asserted to succeed; its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// An admin client.
    pub async fn client(&self) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::read_from(self.kubeconfig()).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.unwrap();
        kube::Client::try_from(config).unwrap()
    }

    pub async fn node(&self, name: &str) -> Option<Node> {
        kube::Api::<Node>::all(self.client().await).get_opt(name).await.unwrap()
    }
}

/// A control-plane part alone (`berth scheduler`, `berth controller-manager`) against a
/// server's admin kubeconfig; SIGKILLed on drop.
pub struct ControlPart {
    process: Option<Process>,
    _dir: tempfile::TempDir,
}

impl ControlPart {
    pub fn scheduler(server: &Server) -> ControlPart {
        ControlPart::start(server, "scheduler", &[])
    }

    pub fn controller_manager(server: &Server, extra: &[&str]) -> ControlPart {
        ControlPart::start(server, "controller-manager", extra)
    }

    fn start(server: &Server, part: &'static str, extra: &[&str]) -> ControlPart {
        let dir = tempfile::tempdir().unwrap();
        let mut command = Command::new(berth_binary());
        command.arg(part).arg("--kubeconfig").arg(server.kubeconfig()).args(extra);
        let mut process = Process::spawn(part, command, dir.path().join(format!("{part}.log")));
        std::thread::sleep(Duration::from_millis(50));
        process.check_alive();
        ControlPart { process: Some(process), _dir: dir }
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().and_then(Process::pid)
    }

    pub fn log(&self) -> String {
        self.process.as_ref().map(Process::log).unwrap_or_default()
    }

    pub fn kill9(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill9();
        }
    }
}

/// One handler of a test runtime: name, binary, global args.
#[derive(Clone, Debug)]
pub struct HandlerSpec {
    pub name: String,
    pub binary: String,
    pub args: Vec<String>,
}

/// What a [`Runtime`] is configured with.
#[derive(Clone, Debug)]
pub struct RuntimeBuilder {
    handlers: Vec<HandlerSpec>,
    default_handler: String,
    insecure_registries: Vec<String>,
    network: Option<(String, String)>,
    /// Leave the CNI conf dir empty: the runtime writes berth's default network.
    berth_default_network: bool,
    netns: Option<String>,
}

impl Default for RuntimeBuilder {
    /// runc (the default), crun, and gvisor (runsc on ptrace, the pod's netns as its network).
    fn default() -> Self {
        RuntimeBuilder {
            handlers: Vec::new(),
            default_handler: "runc".into(),
            insecure_registries: Vec::new(),
            network: None,
            berth_default_network: false,
            netns: None,
        }
        .handler("runc", "runc", &[])
        .handler("crun", "crun", &[])
        .handler("gvisor", "runsc", &["--platform=ptrace", "--network=host"])
    }
}

impl RuntimeBuilder {
    /// No handlers yet; add them with [`Self::handler`] (the first added is the default).
    pub fn empty() -> Self {
        RuntimeBuilder {
            handlers: Vec::new(),
            default_handler: String::new(),
            insecure_registries: Vec::new(),
            network: None,
            berth_default_network: false,
            netns: None,
        }
    }

    pub fn handler(mut self, name: &str, binary: &str, args: &[&str]) -> Self {
        if self.default_handler.is_empty() {
            self.default_handler = name.to_string();
        }
        self.handlers.push(HandlerSpec {
            name: name.into(),
            binary: binary.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
        });
        self
    }

    pub fn default_handler(mut self, name: &str) -> Self {
        self.default_handler = name.into();
        self
    }

    /// A registry host (`127.0.0.1:PORT`) pulled from over plain HTTP.
    pub fn insecure_registry(mut self, host: &str) -> Self {
        self.insecure_registries.push(host.into());
        self
    }

    /// The CNI bridge and its subnet; default: a bridge and a /24 derived from the temp dir.
    pub fn network(mut self, bridge: &str, subnet: &str) -> Self {
        self.network = Some((bridge.into(), subnet.into()));
        self
    }

    /// An empty CNI conf dir of its own: the runtime writes berth's default network there, and
    /// moves it to the node's pod CIDR when the agent says.
    pub fn berth_default_network(mut self) -> Self {
        self.berth_default_network = true;
        self
    }

    /// Runs in the network namespace `netns` (see [`command_in`]).
    pub fn in_netns(mut self, netns: &str) -> Self {
        self.netns = Some(netns.into());
        self
    }

    pub fn start(self) -> Runtime {
        Runtime::start_with(self)
    }
}

/// `berth runtime` on a temp dir: `runtime.toml`, `run/runtime.sock`, `root/`, a state root per
/// handler, a CNI conf dir of its own with one bridge network, and `runtime.log` (every start).
/// Pods left behind are removed on drop.
pub struct Runtime {
    process: Option<Process>,
    pub dir: tempfile::TempDir,
    starts: u32,
    netns: Option<String>,
    /// The bridge of the harness's own network, deleted on drop (the bridge plugin leaves it).
    own_bridge: Option<berth_testenv::cni::BridgeLease>,
}

impl Runtime {
    /// runc, crun and gvisor.
    pub fn start() -> Runtime {
        RuntimeBuilder::default().start()
    }

    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    fn start_with(b: RuntimeBuilder) -> Runtime {
        static NETWORKS: AtomicU32 = AtomicU32::new(0);
        let dir = tempfile::tempdir().unwrap();
        let generated = b.network.is_none() && !b.berth_default_network && b.netns.is_none();
        let (bridge, subnet) = b.network.clone().unwrap_or_else(|| {
            // Distinct per test process and per runtime in it, so parallel tests do not share a bridge.
            let n = std::process::id().wrapping_mul(31).wrapping_add(NETWORKS.fetch_add(1, Ordering::Relaxed));
            (format!("bta{:x}", n % 0xfffff), format!("10.{}.{}.0/24", 128 + (n / 256) % 64, n % 256))
        });
        let cni_dir = dir.path().join("cni");
        std::fs::create_dir_all(&cni_dir).unwrap();
        let conflist = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": bridge,
            "plugins": [{
                "type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": false,
                "ipam": { "type": "host-local", "ranges": [[{ "subnet": subnet }]],
                          "routes": [{ "dst": "0.0.0.0/0" }], "dataDir": dir.path().join("ipam") }
            }]
        });
        if !b.berth_default_network {
            std::fs::write(cni_dir.join("10-test.conflist"), conflist.to_string()).unwrap();
        }
        let mut config = format!(
            "socket = {:?}\nroot = {:?}\ndefault_handler = {:?}\n",
            dir.path().join("run/runtime.sock"),
            dir.path().join("root"),
            b.default_handler
        );
        for h in &b.handlers {
            config.push_str(&format!(
                "[handlers.{}]\nbinary = {:?}\nargs = {:?}\nroot = {:?}\n",
                h.name,
                h.binary,
                h.args,
                dir.path().join("oci").join(&h.name)
            ));
        }
        config.push_str(&format!("[cni]\nconf_dir = {cni_dir:?}\n"));
        for host in &b.insecure_registries {
            config.push_str(&format!("[registries.\"{host}\"]\ninsecure = true\n"));
        }
        std::fs::write(dir.path().join("runtime.toml"), config).unwrap();
        let own_bridge = generated.then(|| berth_testenv::cni::BridgeLease::take(&bridge));
        let mut runtime = Runtime { process: None, dir, starts: 0, netns: b.netns, own_bridge };
        runtime.spawn();
        runtime
    }

    fn spawn(&mut self) {
        assert!(self.process.is_none(), "runtime already running");
        self.starts += 1;
        let mut command = command_in(self.netns.as_deref(), berth_binary());
        command.arg("runtime").arg("--config").arg(self.dir.path().join("runtime.toml"));
        let mut process = Process::spawn("berth runtime", command, self.log_path());
        let deadline = Instant::now() + Duration::from_secs(60);
        // A socket left by a killed runtime is replaced once the new one listens: wait until it
        // answers, not merely exists.
        while std::os::unix::net::UnixStream::connect(self.socket()).is_err() {
            process.check_alive();
            assert!(Instant::now() < deadline, "berth runtime not answering:\n{}", process.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        self.process = Some(process);
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("run/runtime.sock")
    }

    /// The runtime's CNI conf dir.
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.dir.path().join("cni")
    }

    /// `unix:///…/runtime.sock`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    /// SIGTERM and a clean exit (containers keep running).
    pub fn stop(&mut self) {
        self.process.as_mut().expect("runtime running").stop();
        self.process = None;
    }

    pub fn kill9(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill9();
        }
    }

    /// Starts again on the same config and root.
    pub fn restart(&mut self) {
        self.spawn();
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("runtime.log")
    }

    /// The log of every start.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// `berth cri ARGS` against this runtime.
    pub fn cri(&self, args: &[&str]) -> Output {
        Command::new(berth_binary())
            .args(["cri", "-t", "60s"])
            .args(args)
            .env("CONTAINER_RUNTIME_ENDPOINT", self.endpoint())
            .env_remove("IMAGE_SERVICE_ENDPOINT")
            .output()
            .unwrap()
    }

    /// Sandbox IDs of the pod with `uid`.
    pub fn sandboxes_of(&self, uid: &str) -> Vec<String> {
        let out = self.cri(&["pods", "-q", "--label", &format!("io.kubernetes.pod.uid={uid}")]);
        assert!(out.status.success(), "berth cri pods: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).split_whitespace().map(String::from).collect()
    }

    /// Stops and removes every pod sandbox (a test's leftovers: containers outlive the runtime,
    /// and the temp dir cannot be removed under their mounts).
    pub fn remove_all_pods(&self) {
        let out = self.cri(&["pods", "-q"]);
        for pod in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            self.cri(&["stopp", pod]);
            self.cri(&["rmp", pod]);
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let sandboxes = std::fs::read_dir(self.dir.path().join("root/sandboxes"))
            .map(|mut entries| entries.next().is_some())
            .unwrap_or(false);
        if sandboxes {
            if self.process.is_none() {
                // Down at the end of the test: up once more to clean up what it left running.
                self.spawn();
            }
            self.remove_all_pods();
        }
        // Stopped before its bridge goes: a sandbox it is still setting up would bring the
        // bridge back (the bridge plugin creates it on ADD).
        if let Some(p) = self.process.as_mut() {
            p.stop();
        }
        self.own_bridge.take();
    }
}

/// An agent config file naming `endpoints` (endpoint name, runtime) in order.
pub fn agent_toml(endpoints: &[(&str, &Runtime)], partial_readiness: bool) -> String {
    let mut toml = format!("partial_readiness = {partial_readiness}\n");
    for (name, runtime) in endpoints {
        toml.push_str(&format!(
            "[[endpoints]]\nworkload_type = \"container\"\nname = {name:?}\nendpoint = {:?}\n",
            runtime.endpoint()
        ));
    }
    toml
}

/// An `[[endpoints]]` entry for `containerd` named `name`, listing every handler it serves
/// (containerd 1.6's CRI Status reports none).
pub fn containerd_endpoint_toml(name: &str, containerd: &berth_testenv::Containerd) -> String {
    format!(
        "[[endpoints]]\nworkload_type = \"container\"\nname = {name:?}\nendpoint = {:?}\nhandlers = {:?}\n",
        containerd.endpoint(),
        containerd.handlers()
    )
}

/// `berth server token create --node NODE`: a kubeconfig for `system:node:NODE`, written to `dir`.
pub fn node_kubeconfig(server: &Server, node: &str, dir: &Path) -> PathBuf {
    let out = Command::new(berth_binary())
        .args(["server", "token", "create", "--node", node, "--data-dir"])
        .arg(server.data_dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "token create: {}", String::from_utf8_lossy(&out.stderr));
    let path = dir.join(format!("{node}.kubeconfig"));
    std::fs::write(&path, out.stdout).unwrap();
    path
}

/// A CRI runtime client for `endpoint` (`unix:///…`), e.g. to list what a runtime holds.
pub fn cri_client(endpoint: &str) -> RuntimeServiceClient<tonic::transport::Channel> {
    berth_agent::endpoint::Endpoint::connect_lazy("container", "test", endpoint, "").unwrap().runtime
}

/// `berth agent` with a config file (`agent.toml` in its temp dir, rewritten by
/// [`Agent::write_config`]), the server's admin kubeconfig, a free `--port` and a temp
/// `--root-dir`.
pub struct Agent {
    process: Option<Process>,
    pub dir: tempfile::TempDir,
    pub node_name: String,
    pub port: u16,
    kubeconfig: PathBuf,
    extra: Vec<String>,
    starts: u32,
    netns: Option<String>,
}

/// A stopped agent leaves its pods' memory-backed volumes mounted (the pods are removed through
/// CRI at the end of a test, not by the agent): unmounted here so the test leaves no mount behind.
impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
        let _ = berth_agent::pods::unmount_all_under(self.dir.path());
    }
}

impl Agent {
    pub fn start(server: &Server, node_name: &str, config: &str) -> Agent {
        Agent::start_with(server, node_name, config, &[])
    }

    /// As the node itself: with `kubeconfig` (from `berth server token create --node`).
    pub fn start_as(node_name: &str, config: &str, kubeconfig: &Path) -> Agent {
        Agent::launch(node_name, config, kubeconfig, &[])
    }

    /// With extra flags after the harness's own.
    pub fn start_with(server: &Server, node_name: &str, config: &str, extra: &[&str]) -> Agent {
        Agent::launch(node_name, config, &server.kubeconfig(), extra)
    }

    /// As the node itself (`kubeconfig`), in the network namespace `netns` (see [`command_in`]),
    /// with extra flags after the harness's own.
    pub fn start_in_netns(netns: &str, node_name: &str, config: &str, kubeconfig: &Path, extra: &[&str]) -> Agent {
        Agent::launch_in(Some(netns), node_name, config, kubeconfig, extra)
    }

    fn launch(node_name: &str, config: &str, kubeconfig: &Path, extra: &[&str]) -> Agent {
        Agent::launch_in(None, node_name, config, kubeconfig, extra)
    }

    fn launch_in(netns: Option<&str>, node_name: &str, config: &str, kubeconfig: &Path, extra: &[&str]) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("agent.toml"), config).unwrap();
        let mut agent = Agent {
            process: None,
            dir,
            node_name: node_name.into(),
            port: free_port(),
            kubeconfig: kubeconfig.to_path_buf(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            starts: 0,
            netns: netns.map(String::from),
        };
        agent.spawn();
        agent
    }

    fn spawn(&mut self) {
        assert!(self.process.is_none(), "agent already running");
        self.starts += 1;
        let mut command = command_in(self.netns.as_deref(), berth_binary());
        command
            .arg("agent")
            .arg("--config")
            .arg(self.config_path())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--node-name", &self.node_name, "--port", &self.port.to_string(), "--root-dir"])
            .arg(self.dir.path().join("root"));
        // The host's own cluster may be running: tests proxy Services only when they ask to,
        // in a table of their own.
        if !self.extra.iter().any(|a| a.starts_with("--proxy-mode")) {
            command.args(["--proxy-mode", "none"]);
        }
        command.args(&self.extra);
        let log = self.dir.path().join("agent.log");
        let mut process = Process::spawn("berth agent", command, log);
        std::thread::sleep(Duration::from_millis(50));
        process.check_alive();
        self.process = Some(process);
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("agent.toml")
    }

    /// Replaces the config file (atomically, as editors do); the agent picks it up by itself.
    pub fn write_config(&self, config: &str) {
        let tmp = self.dir.path().join("agent.toml.tmp");
        std::fs::write(&tmp, config).unwrap();
        std::fs::rename(&tmp, self.config_path()).unwrap();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().and_then(Process::pid)
    }

    /// Sends a signal by name (`HUP`, `TERM`).
    pub fn signal(&self, signal: &str) {
        self.process.as_ref().expect("agent running").signal(signal);
    }

    /// Asserts the agent is still running.
    pub fn check_alive(&mut self) {
        self.process.as_mut().expect("agent running").check_alive();
    }

    pub fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.stop();
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill9();
        }
    }

    pub fn restart(&mut self) {
        self.spawn();
    }
}

/// The condition of `kind` on a node, if present.
pub fn condition<'a>(node: &'a Node, kind: &str) -> Option<&'a k8s_openapi::api::core::v1::NodeCondition> {
    node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == kind)
}

/// `status.runtimeHandlers` names, in order.
pub fn runtime_handlers(node: &Node) -> Vec<String> {
    node.status
        .as_ref()
        .and_then(|s| s.runtime_handlers.as_ref())
        .map(|hs| hs.iter().map(|h| h.name.clone().unwrap_or_default()).collect())
        .unwrap_or_default()
}
