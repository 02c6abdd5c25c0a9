//! `Containerd` against the real thing: Debian's containerd 1.6 runs a pod through its CRI plugin
//! with an added handler, on its own network, pulling the symlinked busybox and the pause image
//! from the loopback registry; and dropping it without removing the pod leaves nothing behind.
//!
//! Needs root, containerd, runc, the CNI plugins, busybox-static and docker-registry.

use std::path::Path;

use berth_testenv::images::{Format, busybox_symlinked_image};
use berth_testenv::{Containerd, Registry};
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};

async fn channel(socket: &Path) -> Channel {
    let path = socket.to_owned();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .expect("connect to containerd")
}

/// Pids of the processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).replace('\0', " ").contains(needle) {
            pids.push(pid);
        }
    }
    pids
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_runs_a_pod_under_an_added_handler_and_dropping_it_removes_what_the_pod_left() {
    let registry = Registry::start();
    registry.push_pause().await;
    let busybox = tokio::task::spawn_blocking(|| busybox_symlinked_image(Format::Oci)).await.unwrap();
    let image = registry.push_image("busybox", "latest", &busybox).await.reference;
    let host = registry.host().to_owned();
    let containerd =
        tokio::task::spawn_blocking(move || Containerd::builder().registry(&host).handler("ctd-runc", "runc").start())
            .await
            .unwrap();
    assert_eq!(containerd.handlers(), ["runc", "crun", "gvisor", "ctd-runc"]);
    let channel = channel(&containerd.socket()).await;
    let mut runtime = RuntimeServiceClient::new(channel.clone());
    let mut images = ImageServiceClient::new(channel);

    let version = runtime.version(cri::VersionRequest::default()).await.unwrap().into_inner();
    assert_eq!(version.runtime_name, "containerd");
    assert!(version.runtime_version.starts_with("1.6"), "{}", version.runtime_version);

    let sandbox_config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "leftover".into(),
            uid: "uid-leftover".into(),
            namespace: "testenv".into(),
            attempt: 0,
        }),
        log_directory: containerd.dir().join("pod-logs").display().to_string(),
        ..Default::default()
    };
    let sandbox = runtime
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox_config.clone()),
            runtime_handler: "ctd-runc".into(),
        })
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", containerd.log_tail(20)))
        .into_inner()
        .pod_sandbox_id;
    let status = runtime
        .pod_sandbox_status(cri::PodSandboxStatusRequest { pod_sandbox_id: sandbox.clone(), verbose: false })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    let ip = status.network.unwrap().ip;
    let prefix = containerd.network().subnet.trim_end_matches("0/24");
    assert!(ip.starts_with(prefix), "pod IP {ip} in {}", containerd.network().subnet);
    assert_eq!(status.runtime_handler, "ctd-runc");

    let spec = cri::ImageSpec { image: image.clone(), ..Default::default() };
    images.pull_image(cri::PullImageRequest { image: Some(spec.clone()), ..Default::default() }).await.unwrap();
    let container = runtime
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata { name: "sleeper".into(), attempt: 0 }),
                image: Some(spec),
                command: vec!["sleep".into(), "3600".into()],
                log_path: "sleeper.log".into(),
                ..Default::default()
            }),
            sandbox_config: Some(sandbox_config),
        })
        .await
        .unwrap()
        .into_inner()
        .container_id;
    runtime.start_container(cri::StartContainerRequest { container_id: container.clone() }).await.unwrap();
    let status = runtime
        .container_status(cri::ContainerStatusRequest { container_id: container, verbose: true })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.status.unwrap().state, cri::ContainerState::ContainerRunning as i32, "busybox sleep runs");
    let info: serde_json::Value = serde_json::from_str(&status.info["info"]).unwrap();
    let sleep_pid = info["pid"].as_u64().expect("the container's pid") as u32;
    let socket = containerd.socket().display().to_string();
    let shims = processes_mentioning(&format!("-address {socket} "));
    assert!(!shims.is_empty(), "the pod's shim runs");

    let dir = containerd.dir().to_owned();
    let bridge = containerd.network().bridge.clone();
    drop(containerd);
    assert!(!alive(sleep_pid), "the container was killed");
    assert!(shims.iter().all(|p| !alive(*p)), "the shims were killed");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&dir.display().to_string()), "nothing is mounted under {}", dir.display());
    assert!(!Path::new("/sys/class/net").join(&bridge).exists(), "the bridge {bridge} is gone");
    assert!(!dir.exists(), "the temp dir is gone");
}
