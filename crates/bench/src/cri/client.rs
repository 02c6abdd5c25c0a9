//! A CRI v1 client over a unix socket and the timed pod lifecycle, the same calls for berth and
//! containerd.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};

/// How often the client asks whether the container has exited. Both runtimes are polled the same
/// way (containerd 1.6 has no GetContainerEvents); on average this adds half of it to the wait.
pub const EXIT_POLL: Duration = Duration::from_millis(2);
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// The phases of one pod's life, each timed on the client.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub run_pod: Duration,
    pub create_start: Duration,
    /// From StartContainer's return to ContainerStatus saying EXITED.
    pub wait_exit: Duration,
    pub stop_remove_container: Duration,
    /// The StopContainer part of it (the container has already exited).
    pub stop_container: Duration,
    pub stop_remove_pod: Duration,
    /// RunPodSandbox to RemovePodSandbox's return.
    pub lifecycle: Duration,
}

#[derive(Clone)]
pub struct CriClient {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

async fn channel(socket: &Path) -> anyhow::Result<Channel> {
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
        .with_context(|| format!("connecting to {}", socket.display()))
}

/// What a pod is made of: its name, the handler, where its logs go, the image of its container.
pub struct PodSpec<'a> {
    pub name: String,
    pub handler: &'a str,
    pub log_dir: &'a Path,
    pub image: &'a str,
    pub command: Vec<String>,
}

impl<'a> PodSpec<'a> {
    /// A pod whose container runs `true`: the floor's process.
    pub fn exiting(name: String, handler: &'a str, log_dir: &'a Path, image: &'a str) -> Self {
        Self { name, handler, log_dir, image, command: vec!["true".into()] }
    }

    /// A pod whose container keeps running, for memory figures.
    pub fn sleeping(name: String, handler: &'a str, log_dir: &'a Path, image: &'a str) -> Self {
        Self { name, handler, log_dir, image, command: vec!["sleep".into(), "3600".into()] }
    }

    fn sandbox_config(&self) -> cri::PodSandboxConfig {
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: self.name.clone(),
                uid: format!("uid-{}", self.name),
                namespace: "bench".into(),
                attempt: 0,
            }),
            hostname: self.name.clone(),
            log_directory: self.log_dir.to_string_lossy().into_owned(),
            ..Default::default()
        }
    }

    fn container_config(&self) -> cri::ContainerConfig {
        cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata { name: "app".into(), attempt: 0 }),
            image: Some(cri::ImageSpec { image: self.image.into(), ..Default::default() }),
            command: self.command.clone(),
            log_path: format!("{}.log", self.name),
            ..Default::default()
        }
    }
}

/// The verbose `info` JSON of a status response.
fn info(map: &std::collections::HashMap<String, String>) -> serde_json::Value {
    map.get("info").and_then(|s| serde_json::from_str(s).ok()).unwrap_or_default()
}

impl CriClient {
    /// Connects and waits (up to `timeout`) until the runtime reports itself and its network ready.
    pub async fn wait_ready(socket: &Path, timeout: Duration) -> anyhow::Result<Self> {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        loop {
            if socket.exists() {
                match Self::ready(socket).await {
                    Ok(client) => return Ok(client),
                    Err(e) => last = format!("{e:#}"),
                }
            }
            if Instant::now() > deadline {
                bail!("{} not ready after {timeout:?}: {last}", socket.display());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn ready(socket: &Path) -> anyhow::Result<Self> {
        let channel = channel(socket).await?;
        let mut client =
            Self { runtime: RuntimeServiceClient::new(channel.clone()), images: ImageServiceClient::new(channel) };
        let status = client.runtime.status(cri::StatusRequest { verbose: false }).await?.into_inner();
        let conditions = status.status.map(|s| s.conditions).unwrap_or_default();
        for wanted in ["RuntimeReady", "NetworkReady"] {
            let ok = conditions.iter().any(|c| c.r#type == wanted && c.status);
            ensure!(ok, "{wanted} is not true: {conditions:?}");
        }
        Ok(client)
    }

    pub async fn version(&mut self) -> anyhow::Result<String> {
        let v = self.runtime.version(cri::VersionRequest::default()).await?.into_inner();
        Ok(format!("{} {}", v.runtime_name, v.runtime_version))
    }

    pub async fn pull(&mut self, image: &str, handler: &str) -> anyhow::Result<()> {
        let spec = cri::ImageSpec { image: image.into(), runtime_handler: handler.into(), ..Default::default() };
        self.images
            .pull_image(cri::PullImageRequest { image: Some(spec), ..Default::default() })
            .await
            .with_context(|| format!("pulling {image} for {handler}"))?;
        Ok(())
    }

    async fn run_pod(&mut self, pod: &PodSpec<'_>) -> anyhow::Result<String> {
        let request =
            cri::RunPodSandboxRequest { config: Some(pod.sandbox_config()), runtime_handler: pod.handler.into() };
        let response = self.runtime.run_pod_sandbox(request).await.context("RunPodSandbox")?;
        Ok(response.into_inner().pod_sandbox_id)
    }

    async fn create_start(&mut self, sandbox: &str, pod: &PodSpec<'_>) -> anyhow::Result<String> {
        let request = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.into(),
            config: Some(pod.container_config()),
            sandbox_config: Some(pod.sandbox_config()),
        };
        let id = self.runtime.create_container(request).await.context("CreateContainer")?.into_inner().container_id;
        self.runtime
            .start_container(cri::StartContainerRequest { container_id: id.clone() })
            .await
            .context("StartContainer")?;
        Ok(id)
    }

    async fn container_status(&mut self, id: &str, verbose: bool) -> anyhow::Result<cri::ContainerStatusResponse> {
        let request = cri::ContainerStatusRequest { container_id: id.into(), verbose };
        Ok(self.runtime.container_status(request).await.context("ContainerStatus")?.into_inner())
    }

    async fn wait_exit(&mut self, id: &str) -> anyhow::Result<i32> {
        let deadline = Instant::now() + EXIT_TIMEOUT;
        loop {
            let status = self.container_status(id, false).await?.status.context("no container status")?;
            if status.state == cri::ContainerState::ContainerExited as i32 {
                return Ok(status.exit_code);
            }
            ensure!(Instant::now() < deadline, "container {id} has not exited after {EXIT_TIMEOUT:?}");
            tokio::time::sleep(EXIT_POLL).await;
        }
    }

    /// Stop, then remove; returns how long the stop took.
    async fn stop_remove_container(&mut self, id: &str) -> anyhow::Result<Duration> {
        let container_id = id.to_owned();
        let started = Instant::now();
        let stop = cri::StopContainerRequest { container_id: container_id.clone(), timeout: 0 };
        self.runtime.stop_container(stop).await.context("StopContainer")?;
        let stop = started.elapsed();
        self.runtime.remove_container(cri::RemoveContainerRequest { container_id }).await.context("RemoveContainer")?;
        Ok(stop)
    }

    async fn stop_remove_pod(&mut self, sandbox: &str) -> anyhow::Result<()> {
        let pod_sandbox_id = sandbox.to_owned();
        let stop = cri::StopPodSandboxRequest { pod_sandbox_id: pod_sandbox_id.clone() };
        self.runtime.stop_pod_sandbox(stop).await.context("StopPodSandbox")?;
        let remove = cri::RemovePodSandboxRequest { pod_sandbox_id };
        self.runtime.remove_pod_sandbox(remove).await.context("RemovePodSandbox")?;
        Ok(())
    }

    /// One pod, timed: run the sandbox, create and start a container that exits at once, wait for
    /// its exit, stop and remove it, stop and remove the sandbox. Fails unless it exited 0.
    pub async fn lifecycle(&mut self, pod: &PodSpec<'_>) -> anyhow::Result<Sample> {
        let t0 = Instant::now();
        let sandbox = self.run_pod(pod).await?;
        let t1 = Instant::now();
        let id = self.create_start(&sandbox, pod).await?;
        let t2 = Instant::now();
        let code = self.wait_exit(&id).await?;
        let t3 = Instant::now();
        let stop_container = self.stop_remove_container(&id).await?;
        let t4 = Instant::now();
        self.stop_remove_pod(&sandbox).await?;
        let t5 = Instant::now();
        ensure!(code == 0, "the container of pod {} exited with {code}", pod.name);
        Ok(Sample {
            run_pod: t1 - t0,
            create_start: t2 - t1,
            wait_exit: t3 - t2,
            stop_remove_container: t4 - t3,
            stop_container,
            stop_remove_pod: t5 - t4,
            lifecycle: t5 - t0,
        })
    }

    /// Starts a pod whose container keeps running; returns (sandbox id, container id).
    pub async fn start_long_running(&mut self, pod: &PodSpec<'_>) -> anyhow::Result<(String, String)> {
        let sandbox = self.run_pod(pod).await?;
        let id = self.create_start(&sandbox, pod).await?;
        Ok((sandbox, id))
    }

    /// The verbose status `info` of a container (berth: `pid`, `monitorPid`; containerd: `pid`).
    pub async fn container_info(&mut self, id: &str) -> anyhow::Result<serde_json::Value> {
        Ok(info(&self.container_status(id, true).await?.info))
    }

    /// The verbose status `info` of a sandbox (berth: `pid` of its infra process).
    pub async fn sandbox_info(&mut self, id: &str) -> anyhow::Result<serde_json::Value> {
        let request = cri::PodSandboxStatusRequest { pod_sandbox_id: id.into(), verbose: true };
        Ok(info(&self.runtime.pod_sandbox_status(request).await?.into_inner().info))
    }

    /// The ids of every sandbox and every container the runtime has.
    pub async fn list(&mut self) -> anyhow::Result<(Vec<String>, Vec<String>)> {
        let pods = self.runtime.list_pod_sandbox(cri::ListPodSandboxRequest::default()).await?.into_inner().items;
        let containers = self.runtime.list_containers(cri::ListContainersRequest::default()).await?.into_inner();
        Ok((pods.into_iter().map(|p| p.id).collect(), containers.containers.into_iter().map(|c| c.id).collect()))
    }

    /// Stops and removes every pod the runtime has (ours, from a failed or finished run), so no
    /// container, netns or address outlives the bench. Returns how many there were.
    pub async fn remove_all(&mut self) -> anyhow::Result<usize> {
        let pods = self.runtime.list_pod_sandbox(cri::ListPodSandboxRequest::default()).await?.into_inner().items;
        let containers = self.runtime.list_containers(cri::ListContainersRequest::default()).await?.into_inner();
        for c in containers.containers {
            let _ = self.stop_remove_container(&c.id).await;
        }
        for pod in &pods {
            self.stop_remove_pod(&pod.id).await?;
        }
        Ok(pods.len())
    }
}

/// `VmRSS` of a process in KiB, from `/proc/<pid>/status`.
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("process {pid}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no VmRSS for process {pid}"))
}

/// The parent pid of a process (the shim of a containerd container).
pub fn parent_pid(pid: u32) -> anyhow::Result<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no PPid for process {pid}"))
}

/// The executable name of a process.
pub fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim().to_owned()).unwrap_or_default()
}

/// A pid from a verbose info field.
pub fn pid_field(info: &serde_json::Value, field: &str) -> anyhow::Result<u32> {
    info[field].as_u64().filter(|p| *p > 0).map(|p| p as u32).with_context(|| format!("no {field} in {info}"))
}

/// The directory pods of one runtime and handler write their logs to.
pub fn log_dir(root: &Path, runtime: &str, handler: &str) -> anyhow::Result<PathBuf> {
    let dir = root.join("logs").join(runtime).join(handler);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rss_and_parent_of_this_process_are_read_from_proc() {
        let me = std::process::id();
        assert!(rss_kib(me).unwrap() > 0);
        assert_eq!(parent_pid(me).unwrap(), std::os::unix::process::parent_id());
    }

    #[test]
    fn pids_come_from_verbose_info_and_zero_means_none() {
        let info = serde_json::json!({"pid": 42, "monitorPid": 0});
        assert_eq!(pid_field(&info, "pid").unwrap(), 42);
        assert!(pid_field(&info, "monitorPid").is_err());
        assert!(pid_field(&info, "missing").is_err());
    }
}
