//! Pods and containers through the CRI RuntimeService, in-process on a temporary socket, with real
//! runc, crun and runsc, the real CNI plugins on a bridge of the test's own, and images pulled
//! from a real registry on loopback. Needs root (as the runtime does).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_image::Images;
use berth_runtime::config::Config;
use berth_runtime::cri::{Cri, Options, grpc};
use berth_runtime::server;
use berth_testenv::Registry;
use berth_testenv::cni::BridgeLease;
use berth_testenv::images::{Format, busybox_image};
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};

/// The bridge of this test binary's pods (its runtimes share it).
const BRIDGE: &str = "berthpt0";

/// One subnet per test process, so that parallel test binaries do not share a bridge.
fn network_conflist(dir: &Path, bridge: &str, subnet: &str) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": bridge,
        "plugins": [
            {
                "type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": false, "hairpinMode": true,
                "ipam": { "type": "host-local", "ranges": [[{ "subnet": subnet }]],
                          "routes": [{ "dst": "0.0.0.0/0" }], "dataDir": dir.join("ipam") }
            },
            { "type": "portmap", "capabilities": { "portMappings": true } }
        ]
    })
    .to_string()
}

struct Runtime {
    dir: tempfile::TempDir,
    cri: Arc<Cri>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), server::ServeError>>>,
    registry: Registry,
    /// Last: the bridge goes once no runtime of this process uses it.
    _bridge: BridgeLease,
}

impl Runtime {
    async fn start() -> Runtime {
        // BERTH_LOG=debug shows the runtime's own log while debugging a test.
        if let Ok(filter) = std::env::var("BERTH_LOG") {
            let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
        }
        let registry = Registry::start();
        registry.push_image("busybox", "latest", &busybox_image(Format::Oci)).await;
        let dir = tempfile::tempdir().unwrap();
        let cni_dir = dir.path().join("cni");
        std::fs::create_dir_all(&cni_dir).unwrap();
        std::fs::write(cni_dir.join("10-test.conflist"), network_conflist(dir.path(), BRIDGE, "10.203.0.0/24"))
            .unwrap();
        Self::open(dir, registry).await
    }

    /// The runtime on `dir` (config, root, conflist), as a restart finds it.
    async fn open(dir: tempfile::TempDir, registry: Registry) -> Runtime {
        let cni_dir = dir.path().join("cni");
        let text = format!(
            r#"socket = {socket:?}
root = {root:?}
default_handler = "runc"
[handlers.runc]
binary = "runc"
root = {runc_root:?}
[handlers.crun]
binary = "crun"
root = {crun_root:?}
[handlers.gvisor]
binary = "runsc"
args = ["--platform=ptrace", "--network=host"]
root = {runsc_root:?}
[cni]
conf_dir = {cni_dir:?}
[registries."{host}"]
insecure = true
"#,
            socket = dir.path().join("run/cri.sock"),
            root = dir.path().join("root"),
            runc_root = dir.path().join("runc"),
            crun_root = dir.path().join("crun"),
            runsc_root = dir.path().join("runsc"),
            host = registry.host(),
        );
        let config = Config::from_toml(&text, OsStr::new("")).unwrap();
        let images = Images::open(config.images_config()).unwrap();
        let listener = server::bind(&config.socket).await.unwrap();
        let options = Options { monitor_binary: Some(berth_testenv::monitor::monitor_binary()), ..Default::default() };
        let cri = Cri::open(config, Arc::new(images), options).await.unwrap();
        let routes = grpc::routes(cri.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(listener.serve(routes, async {
            let _ = stopped.await;
        }));
        Runtime { dir, cri, stop: Some(stop), task: Some(task), registry, _bridge: BridgeLease::take(BRIDGE) }
    }

    async fn channel(&self) -> Channel {
        let path = self.dir.path().join("run/cri.sock");
        Endpoint::from_static("http://localhost")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .unwrap()
    }

    async fn client(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel().await)
    }

    async fn pull(&self, handler: &str) -> String {
        let image = self.registry.reference("busybox:latest");
        let mut images = ImageServiceClient::new(self.channel().await);
        images
            .pull_image(cri::PullImageRequest {
                image: Some(cri::ImageSpec {
                    image: image.clone(),
                    runtime_handler: handler.into(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .unwrap();
        image
    }

    fn logs(&self) -> PathBuf {
        self.dir.path().join("logs")
    }

    async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let _ = self.task.take().unwrap().await;
        assert!(self.cri.finish_background(Duration::from_secs(30)).await, "background cleanups did not finish");
        drop(self.cri);
    }

    /// Stops serving and opens a new runtime on the same directory.
    async fn restart(mut self) -> Runtime {
        let _ = self.stop.take().unwrap().send(());
        let _ = self.task.take().unwrap().await;
        let Runtime { dir, registry, .. } = self;
        Self::open(dir, registry).await
    }
}

fn pod_config(name: &str) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: String::new(),
        ..Default::default()
    }
}

fn container_config(name: &str, image: &str, script: &str) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata { name: name.into(), attempt: 0 }),
        image: Some(cri::ImageSpec { image: image.into(), ..Default::default() }),
        command: vec!["sh".into(), "-c".into(), script.into()],
        log_path: format!("{name}.log"),
        ..Default::default()
    }
}

async fn status(c: &mut RuntimeServiceClient<Channel>, id: &str) -> cri::ContainerStatus {
    c.container_status(cri::ContainerStatusRequest { container_id: id.into(), verbose: false })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap()
}

async fn wait_for_state(
    c: &mut RuntimeServiceClient<Channel>,
    id: &str,
    state: cri::ContainerState,
) -> cri::ContainerStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = status(c, id).await;
        if s.state == state as i32 {
            return s;
        }
        assert!(Instant::now() < deadline, "container {id} never reached {state:?}: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A whole pod lifecycle under one handler, checking what each step leaves on the host.
async fn lifecycle(handler: &str) {
    let rt = Runtime::start().await;
    let image = rt.pull(handler).await;
    let mut c = rt.client().await;
    let mut pod = pod_config(&format!("web-{handler}"));
    pod.log_directory = rt.logs().to_string_lossy().into_owned();
    let sandbox = c
        .run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(pod.clone()), runtime_handler: handler.into() })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    let pod_status = c
        .pod_sandbox_status(cri::PodSandboxStatusRequest { pod_sandbox_id: sandbox.clone(), verbose: true })
        .await
        .unwrap()
        .into_inner();
    let s = pod_status.status.unwrap();
    assert_eq!(s.state, cri::PodSandboxState::SandboxReady as i32);
    assert_eq!(s.runtime_handler, handler);
    let ip = s.network.unwrap().ip;
    assert!(ip.starts_with("10.203.0."), "pod IP {ip:?} is from the test's subnet");
    let netns = PathBuf::from(format!("/run/berth/netns/{sandbox}"));
    assert!(berth_runtime::reality::is_netns(&netns).unwrap(), "the pod's netns is mounted");

    let script = "echo hello out; echo hello err >&2; trap 'exit 3' TERM; while true; do sleep 0.1; done";
    let config = container_config("app", &image, script);
    let id = c
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(config.clone()),
            sandbox_config: Some(pod.clone()),
        })
        .await
        .unwrap()
        .into_inner()
        .container_id;
    assert_eq!(status(&mut c, &id).await.state, cri::ContainerState::ContainerCreated as i32);
    c.start_container(cri::StartContainerRequest { container_id: id.clone() }).await.unwrap();
    let running = status(&mut c, &id).await;
    assert_eq!(running.state, cri::ContainerState::ContainerRunning as i32);
    assert!(running.started_at > 0);

    let exec = c
        .exec_sync(cri::ExecSyncRequest {
            container_id: id.clone(),
            cmd: vec!["sh".into(), "-c".into(), "hostname; exit 7".into()],
            timeout: 10,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(exec.exit_code, 7);
    assert_eq!(String::from_utf8_lossy(&exec.stdout).trim(), format!("web-{handler}"), "the pod's hostname");

    let log = rt.logs().join("app.log");
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("hello err") && text.contains("hello out") {
            break text;
        }
        assert!(Instant::now() < deadline, "log has: {text:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(text.lines().any(|l| l.ends_with(" stdout F hello out")), "{text}");
    assert!(text.lines().any(|l| l.ends_with(" stderr F hello err")), "{text}");

    let stats = c
        .container_stats(cri::ContainerStatsRequest { container_id: id.clone() })
        .await
        .unwrap()
        .into_inner()
        .stats
        .unwrap();
    assert!(stats.writable_layer.is_some());
    if handler != "gvisor" {
        assert!(
            stats.memory.and_then(|m| m.working_set_bytes).is_some_and(|w| w.value > 0),
            "memory is read from the cgroup"
        );
    }

    c.stop_container(cri::StopContainerRequest { container_id: id.clone(), timeout: 10 }).await.unwrap();
    let exited = status(&mut c, &id).await;
    assert_eq!(exited.state, cri::ContainerState::ContainerExited as i32);
    assert_eq!(exited.exit_code, 3, "the TERM trap's exit code");
    assert_eq!(exited.reason, "Error");

    c.remove_container(cri::RemoveContainerRequest { container_id: id.clone() }).await.unwrap();
    let e =
        c.container_status(cri::ContainerStatusRequest { container_id: id.clone(), verbose: false }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    c.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: sandbox.clone() }).await.unwrap();
    c.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: sandbox.clone() }).await.unwrap();
    assert!(!netns.exists(), "stop removed the netns");
    c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sandbox.clone() }).await.unwrap();
    let pods = c.list_pod_sandbox(cri::ListPodSandboxRequest::default()).await.unwrap().into_inner().items;
    assert!(pods.is_empty());
    // gVisor's host side is removed in the background (runsc delete takes over a second).
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let gone = !mounts.contains(&sandbox) && !mounts.contains(&id);
        let cgroup = ["memory", "cpu", "pids"]
            .iter()
            .any(|c| Path::new("/sys/fs/cgroup").join(c).join("berth").join(&sandbox).exists());
        if gone && !cgroup && !rt.dir.path().join("root/containers").join(&id).exists() {
            break;
        }
        assert!(Instant::now() < deadline, "a mount, cgroup or directory of the pod or container is left");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gvisor_container_whose_start_fails_leaves_no_cgroup_behind() {
    let rt = Runtime::start().await;
    let image = rt.pull("gvisor").await;
    let mut c = rt.client().await;
    let privileged = || cri::LinuxContainerSecurityContext { privileged: true, ..Default::default() };
    let mut pod = pod_config("gvisor-fails");
    pod.log_directory = rt.logs().to_string_lossy().into_owned();
    pod.linux = Some(cri::LinuxPodSandboxConfig {
        security_context: Some(cri::LinuxSandboxSecurityContext { privileged: true, ..Default::default() }),
        ..Default::default()
    });
    let sandbox = c
        .run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(pod.clone()), runtime_handler: "gvisor".into() })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    let mut config = container_config("privileged", &image, "true");
    config.command = vec!["/no/such/binary".into()];
    config.linux = Some(cri::LinuxContainerConfig { security_context: Some(privileged()), ..Default::default() });
    let id = create(&mut c, &sandbox, &pod, config).await.unwrap();
    // runsc fails this start once it made the sandbox and the container's cgroup ("creating
    // process: failed to load /no/such/binary"), and leaves the cgroup; nothing may stay.
    let started = c.start_container(cri::StartContainerRequest { container_id: id.clone() }).await;
    assert!(started.as_ref().is_err_and(|e| e.message().contains("/no/such/binary")), "start: {started:?}");
    c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sandbox.clone() }).await.unwrap();
    rt.shutdown().await;
    assert_eq!(leaks(&[&sandbox, &id]), Vec::<String>::new(), "start: {started:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runc_pod_runs_logs_execs_stops_and_leaves_nothing_behind() {
    lifecycle("runc").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crun_pod_runs_logs_execs_stops_and_leaves_nothing_behind() {
    lifecycle("crun").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gvisor_pod_runs_logs_execs_stops_and_leaves_nothing_behind() {
    lifecycle("gvisor").await;
}

/// An ExecSync that outlives its timeout fails with DeadlineExceeded and leaves no process behind
/// in the container (critest's "execSync with timeout").
async fn a_timed_out_exec_leaves_no_process(handler: &str) {
    let rt = Runtime::start().await;
    let image = rt.pull(handler).await;
    let mut c = rt.client().await;
    let (sandbox, pod) = run_pod(&mut c, &rt, &format!("exec-timeout-{handler}"), handler).await;
    let id = create(&mut c, &sandbox, &pod, container_config("app", &image, "sleep 600")).await.unwrap();
    c.start_container(cri::StartContainerRequest { container_id: id.clone() }).await.unwrap();
    let exec = |cmd: &[&str], timeout| cri::ExecSyncRequest {
        container_id: id.clone(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        timeout,
    };
    let started = Instant::now();
    let e = c.exec_sync(exec(&["sleep", "77"], 1)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{}", e.message());
    assert!(started.elapsed() < Duration::from_secs(8), "the exec returned {:?} after its timeout", started.elapsed());
    // The exec's process may take a moment to be reaped; it must not stay.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ps = c.exec_sync(exec(&["sh", "-c", "ps | grep 'sleep 77$' || true"], 10)).await.unwrap().into_inner();
        let left = String::from_utf8_lossy(&ps.stdout).trim().to_string();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "the timed-out exec is still running under {handler}: {left}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sandbox.clone() }).await.unwrap();
    rt.shutdown().await;
    assert_eq!(leaks(&[&sandbox, &id]), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_exec_under_runc_is_killed() {
    a_timed_out_exec_leaves_no_process("runc").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_exec_under_gvisor_is_killed_inside_the_sandbox() {
    a_timed_out_exec_leaves_no_process("gvisor").await;
}

async fn run_pod(
    c: &mut RuntimeServiceClient<Channel>,
    rt: &Runtime,
    name: &str,
    handler: &str,
) -> (String, cri::PodSandboxConfig) {
    let mut pod = pod_config(name);
    pod.log_directory = rt.logs().to_string_lossy().into_owned();
    let id = c
        .run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(pod.clone()), runtime_handler: handler.into() })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    (id, pod)
}

async fn create(
    c: &mut RuntimeServiceClient<Channel>,
    sandbox: &str,
    pod: &cri::PodSandboxConfig,
    config: cri::ContainerConfig,
) -> Result<String, tonic::Status> {
    c.create_container(cri::CreateContainerRequest {
        pod_sandbox_id: sandbox.into(),
        config: Some(config),
        sandbox_config: Some(pod.clone()),
    })
    .await
    .map(|r| r.into_inner().container_id)
}

/// Mounts, netns files and berth-pause processes on the host that mention any of `ids`.
fn leaks(ids: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for line in mounts.lines() {
        if ids.iter().any(|id| line.contains(id)) {
            found.push(format!("mount: {line}"));
        }
    }
    for id in ids {
        if Path::new("/run/berth/netns").join(id).exists() {
            found.push(format!("netns: {id}"));
        }
        for controller in ["memory", "cpu", "pids"] {
            let cgroup = Path::new("/sys/fs/cgroup").join(controller).join("berth").join(id);
            if cgroup.exists() {
                found.push(format!("cgroup: {}", cgroup.display()));
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn illegal_transitions_and_bad_requests_get_clear_errors_and_leak_nothing() {
    let rt = Runtime::start().await;
    let image = rt.pull("runc").await;
    let mut c = rt.client().await;
    let code = |r: Result<tonic::Response<_>, tonic::Status>| match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => (e.code(), e.message().to_string()),
    };

    // Unknown handler: InvalidArgument naming it and the configured ones.
    let (code_, message) = code(
        c.run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(pod_config("x")), runtime_handler: "kata".into() })
            .await,
    );
    assert_eq!(code_, tonic::Code::InvalidArgument);
    assert!(message.contains("\"kata\"") && message.contains("crun, gvisor, runc"), "{message}");

    let (sandbox, pod) = run_pod(&mut c, &rt, "bad", "runc").await;
    // The same pod (name, namespace, uid, attempt) twice: AlreadyExists naming the holder.
    let (code_, message) = code(
        c.run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(pod.clone()), runtime_handler: String::new() })
            .await,
    );
    assert_eq!(code_, tonic::Code::AlreadyExists, "{message}");
    assert!(message.contains(&sandbox), "{message}");

    // Missing image: NotFound naming it and the handler.
    let e = create(&mut c, &sandbox, &pod, container_config("a", "127.0.0.1:1/none:1", "true")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{}", e.message());
    assert!(e.message().contains("127.0.0.1:1/none:1") && e.message().contains("runc"), "{}", e.message());

    // A relative host path: InvalidArgument, and the name stays free.
    let mut bad = container_config("a", &image, "true");
    bad.mounts.push(cri::Mount {
        container_path: "/data".into(),
        host_path: "relative/dir".into(),
        ..Default::default()
    });
    let e = create(&mut c, &sandbox, &pod, bad).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{}", e.message());
    assert!(e.message().contains("relative/dir"), "{}", e.message());
    // A command that does not exist: as with containerd, the OCI runtime fails at StartContainer
    // and the container is exited with 128, StartError and the runtime's message.
    let mut missing = container_config("a", &image, "true");
    missing.command = vec!["/no/such/binary".into()];
    let failed = create(&mut c, &sandbox, &pod, missing).await.unwrap();
    let e = c.start_container(cri::StartContainerRequest { container_id: failed.clone() }).await.unwrap_err();
    assert!(e.message().contains("/no/such/binary"), "{}", e.message());
    let exited = status(&mut c, &failed).await;
    assert_eq!(exited.state(), cri::ContainerState::ContainerExited);
    assert_eq!((exited.exit_code, exited.reason.as_str()), (128, "StartError"));
    assert!(exited.message.contains("/no/such/binary"), "{}", exited.message);
    c.remove_container(cri::RemoveContainerRequest { container_id: failed }).await.unwrap();

    let id = create(&mut c, &sandbox, &pod, container_config("a", &image, "sleep 60")).await.unwrap();
    // The same container name and attempt in the pod: AlreadyExists.
    let e = create(&mut c, &sandbox, &pod, container_config("a", &image, "sleep 60")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{}", e.message());
    // Exec before start: FailedPrecondition.
    let e = c
        .exec_sync(cri::ExecSyncRequest { container_id: id.clone(), cmd: vec!["true".into()], timeout: 5 })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{}", e.message());
    c.start_container(cri::StartContainerRequest { container_id: id.clone() }).await.unwrap();
    // Start twice: an illegal transition.
    let e = c.start_container(cri::StartContainerRequest { container_id: id.clone() }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{}", e.message());
    assert!(e.message().contains("running"), "{}", e.message());
    // ExecSync past its timeout: DeadlineExceeded.
    let e = c
        .exec_sync(cri::ExecSyncRequest {
            container_id: id.clone(),
            cmd: vec!["sleep".into(), "30".into()],
            timeout: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{}", e.message());

    // A stopped sandbox takes no new containers.
    c.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: sandbox.clone() }).await.unwrap();
    assert_eq!(
        status(&mut c, &id).await.state,
        cri::ContainerState::ContainerExited as i32,
        "stop pod stops its containers"
    );
    let e = create(&mut c, &sandbox, &pod, container_config("b", &image, "true")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{}", e.message());
    // Remove the pod (and its container), then every verb on them is NotFound, removes succeed.
    c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sandbox.clone() }).await.unwrap();
    let e = c.start_container(cri::StartContainerRequest { container_id: id.clone() }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{}", e.message());
    let e = c.stop_container(cri::StopContainerRequest { container_id: id.clone(), timeout: 0 }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{}", e.message());
    c.remove_container(cri::RemoveContainerRequest { container_id: id.clone() }).await.unwrap();
    c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sandbox.clone() }).await.unwrap();
    let e = c
        .pod_sandbox_status(cri::PodSandboxStatusRequest { pod_sandbox_id: sandbox.clone(), verbose: false })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert_eq!(leaks(&[&sandbox, &id]), Vec::<String>::new());
    let containers = std::fs::read_dir(rt.dir.path().join("root/containers")).unwrap().count();
    assert_eq!(containers, 0, "no container directory is left after failed creates");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exit_is_recorded_with_its_code_and_streamed_as_events() {
    let rt = Runtime::start().await;
    let image = rt.pull("runc").await;
    let mut c = rt.client().await;
    let mut events = rt.client().await.get_container_events(cri::GetEventsRequest {}).await.unwrap().into_inner();
    let (sandbox, pod) = run_pod(&mut c, &rt, "events", "runc").await;
    let mut config = container_config("job", &image, "echo done; exit 0");
    config.labels.insert("role".into(), "job".into());
    let id = create(&mut c, &sandbox, &pod, config).await.unwrap();
    c.start_container(cri::StartContainerRequest { container_id: id.clone() }).await.unwrap();
    let exited = wait_for_state(&mut c, &id, cri::ContainerState::ContainerExited).await;
    assert_eq!((exited.exit_code, exited.reason.as_str()), (0, "Completed"));
    assert!(exited.finished_at >= exited.started_at && exited.started_at > 0);

    // Filters: by label, by state, by sandbox.
    let list = |f: cri::ContainerFilter| cri::ListContainersRequest { filter: Some(f) };
    let by_label = c
        .list_containers(list(cri::ContainerFilter {
            label_selector: [("role".to_string(), "job".to_string())].into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert_eq!(by_label.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), [id.as_str()]);
    let running = c
        .list_containers(list(cri::ContainerFilter {
            state: Some(cri::ContainerStateValue { state: cri::ContainerState::ContainerRunning as i32 }),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert!(running.is_empty());

    c.remove_container(cri::RemoveContainerRequest { container_id: id.clone() }).await.unwrap();
    c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sandbox.clone() }).await.unwrap();
    let mut kinds = Vec::new();
    while kinds.len() < 4 {
        let e = tokio::time::timeout(Duration::from_secs(10), events.message()).await.unwrap().unwrap().unwrap();
        assert_eq!(e.container_id, id);
        kinds.push(e.container_event_type);
    }
    use cri::ContainerEventType::*;
    let want = [ContainerCreatedEvent, ContainerStartedEvent, ContainerStoppedEvent, ContainerDeletedEvent];
    assert_eq!(kinds, want.map(|k| k as i32));
    // An open event stream would hold the server's graceful shutdown.
    drop(events);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_reopened_on_request_and_resources_update_the_cgroup() {
    let rt = Runtime::start().await;
    let image = rt.pull("runc").await;
    let mut c = rt.client().await;
    let (sandbox, pod) = run_pod(&mut c, &rt, "ops", "runc").await;
    let id =
        create(&mut c, &sandbox, &pod, container_config("tick", &image, "while true; do echo tick; sleep 0.1; done"))
            .await
            .unwrap();
    c.start_container(cri::StartContainerRequest { container_id: id.clone() }).await.unwrap();
    let log = rt.logs().join("tick.log");
    let rotated = rt.logs().join("tick.log.1");
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::rename(&log, &rotated).unwrap();
    c.reopen_container_log(cri::ReopenContainerLogRequest { container_id: id.clone() }).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("tick") {
        assert!(Instant::now() < deadline, "nothing written to the reopened log");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(std::fs::read_to_string(&rotated).unwrap().contains("tick"));

    let limit = 64 * 1024 * 1024;
    c.update_container_resources(cri::UpdateContainerResourcesRequest {
        container_id: id.clone(),
        linux: Some(cri::LinuxContainerResources { memory_limit_in_bytes: limit, ..Default::default() }),
        ..Default::default()
    })
    .await
    .unwrap();
    let cgroup = Path::new("/sys/fs/cgroup/memory/berth").join(&sandbox).join(&id).join("memory.limit_in_bytes");
    assert_eq!(std::fs::read_to_string(cgroup).unwrap().trim(), limit.to_string());
    let reported = status(&mut c, &id).await.resources.and_then(|r| r.linux).unwrap();
    assert_eq!(reported.memory_limit_in_bytes, limit);

    c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sandbox.clone() }).await.unwrap();
    // Stopped: reopening is refused.
    let e = c.reopen_container_log(cri::ReopenContainerLogRequest { container_id: id }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_pulled_without_a_handler_serves_a_handler_with_the_same_platform() {
    let rt = Runtime::start().await;
    // As kubelet, crictl and critest pull: no runtime handler, so the default one (runc).
    let image = rt.pull("").await;
    let mut c = rt.client().await;
    let (sandbox, pod) = run_pod(&mut c, &rt, "fallback", "crun").await;
    let id = create(&mut c, &sandbox, &pod, container_config("app", &image, "exit 5")).await.unwrap();
    c.start_container(cri::StartContainerRequest { container_id: id.clone() }).await.unwrap();
    let exited = wait_for_state(&mut c, &id, cri::ContainerState::ContainerExited).await;
    assert_eq!(exited.exit_code, 5);
    c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sandbox.clone() }).await.unwrap();
    assert_eq!(leaks(&[&sandbox, &id]), Vec::<String>::new());
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_finishes_a_container_removal_that_a_crash_interrupted() {
    let rt = Runtime::start().await;
    // What a crash leaves between a gVisor container's record removal and its host cleanup: a
    // record-less directory with the rootfs still mounted.
    let id = "f".repeat(64);
    let dir = rt.dir.path().join("root/containers").join(&id);
    let rootfs = dir.join("bundle/rootfs");
    berth_runtime::host::mount_tmpfs(&rootfs, "size=1m").unwrap();
    assert!(berth_runtime::host::is_mounted(&rootfs));
    let rt = rt.restart().await;
    assert!(!dir.exists(), "the stray directory is gone");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&id), "its rootfs is unmounted");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_with_a_terminal_runs_on_a_pty_under_runc_and_gvisor() {
    let rt = Runtime::start().await;
    let mut c = rt.client().await;
    for handler in ["runc", "gvisor"] {
        let image = rt.pull(handler).await;
        let (sandbox, pod) = run_pod(&mut c, &rt, &format!("tty-{handler}"), handler).await;
        // (gVisor's terminal is a host file inside the sandbox: `tty` cannot name it, isatty works.)
        let mut config = container_config("term", &image, "[ -t 0 ] && [ -t 1 ] && echo on a terminal $TERM; exit 7");
        config.tty = true;
        config.stdin = true;
        config.log_path = format!("term-{handler}.log");
        let id = create(&mut c, &sandbox, &pod, config).await.unwrap();
        c.start_container(cri::StartContainerRequest { container_id: id.clone() }).await.unwrap();
        let exited = wait_for_state(&mut c, &id, cri::ContainerState::ContainerExited).await;
        assert_eq!(exited.exit_code, 7, "{handler}");
        let log = std::fs::read_to_string(rt.logs().join(format!("term-{handler}.log"))).unwrap();
        let contents: Vec<&str> = log.lines().filter_map(|l| l.splitn(4, ' ').nth(3)).collect();
        assert_eq!(contents, ["on a terminal xterm"], "{handler}: {log}");
        assert!(log.lines().all(|l| l.contains(" stdout F ")), "{handler}: one stream: {log}");
        c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sandbox }).await.unwrap();
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_image_of_a_running_container_keeps_its_layers_until_the_container_is_gone() {
    let rt = Runtime::start().await;
    let image = rt.pull("runc").await;
    let mut c = rt.client().await;
    let mut images = ImageServiceClient::new(rt.channel().await);
    let layers = rt.dir.path().join("root/images/layers");
    let layer_count = || std::fs::read_dir(&layers).map(|d| d.count()).unwrap_or(0);
    let (sandbox, pod) = run_pod(&mut c, &rt, "rmi", "runc").await;
    let id = create(&mut c, &sandbox, &pod, container_config("app", &image, "sleep 300")).await.unwrap();
    c.start_container(cri::StartContainerRequest { container_id: id.clone() }).await.unwrap();
    let spec = || Some(cri::ImageSpec { image: image.clone(), runtime_handler: "runc".into(), ..Default::default() });
    let remove = cri::RemoveImageRequest { image: spec() };

    images.remove_image(remove.clone()).await.unwrap();
    let listed = images.list_images(cri::ListImagesRequest { filter: None }).await.unwrap().into_inner().images;
    assert!(listed.is_empty(), "the image is gone from the list: {listed:?}");
    assert!(layer_count() > 0, "its layers stay under the running container");
    let read = c
        .exec_sync(cri::ExecSyncRequest {
            container_id: id.clone(),
            cmd: vec!["sh".into(), "-c".into(), "cat /bin/busybox | wc -c".into()],
            timeout: 10,
        })
        .await
        .unwrap()
        .into_inner();
    let size: u64 = String::from_utf8_lossy(&read.stdout).trim().parse().unwrap();
    assert_eq!((read.exit_code, size > 0), (0, true), "the container still reads its image's files");

    c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sandbox }).await.unwrap();
    // The next sweep (this pull and removal) frees them.
    rt.pull("runc").await;
    images.remove_image(remove).await.unwrap();
    assert_eq!(layer_count(), 0, "no layer is left once nothing uses it");
    rt.shutdown().await;
}
