//! A CRI runtime in memory that records the calls made to it, for unit tests of the pod workers:
//! sandboxes and containers keep their CRI state, containers run until told to exit (or exit at
//! start with scripted codes), and the runtime can go away and come back.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use k8s_cri::v1 as cri;
use tonic::Status;

use super::clock::Clock;
use crate::endpoint::{Call, Cri};

/// What a started container does by itself.
#[derive(Debug, Default)]
struct Script {
    /// Exit codes of its next starts, one per start; it runs on when none is left.
    exits: VecDeque<i32>,
}

#[derive(Debug)]
struct Sandbox {
    id: String,
    config: cri::PodSandboxConfig,
    handler: String,
    ready: bool,
    created_at: i64,
    ip: String,
}

#[derive(Debug)]
struct Container {
    id: String,
    sandbox_id: String,
    config: cri::ContainerConfig,
    state: cri::ContainerState,
    created_at: i64,
    started_at: i64,
    finished_at: i64,
    exit_code: i32,
}

#[derive(Debug, Default)]
struct Inner {
    calls: Vec<String>,
    sandboxes: Vec<Sandbox>,
    containers: Vec<Container>,
    images: HashSet<String>,
    scripts: HashMap<String, Script>,
    down: bool,
    /// The runtime goes down when this call arrives.
    down_at: Option<&'static str>,
    exec_takes: Duration,
}

/// The fake runtime. Calls are recorded as `Method argument…` with sandboxes and containers
/// named by ID (`sandbox-<attempt>`, `<name>-<attempt>`), so tests read like the runtime's log.
#[derive(Debug)]
pub struct FakeRuntime {
    clock: Clock,
    inner: Mutex<Inner>,
}

fn nanos(clock: &Clock) -> i64 {
    i64::try_from(clock.now().as_nanosecond()).unwrap_or(i64::MAX)
}

fn matches(selector: &HashMap<String, String>, labels: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The calls that change something, as opposed to lists and status reads.
pub fn is_change(call: &str) -> bool {
    !call.starts_with("List") && !call.contains("Status")
}

impl FakeRuntime {
    pub fn new(clock: Clock) -> FakeRuntime {
        FakeRuntime { clock, inner: Mutex::new(Inner::default()) }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<String> {
        self.inner().calls.clone()
    }

    /// The calls so far that change something (see [`is_change`]).
    pub fn changes(&self) -> Vec<String> {
        self.calls().into_iter().filter(|c| is_change(c)).collect()
    }

    /// Forgets the calls recorded so far.
    pub fn clear_calls(&self) {
        self.inner().calls.clear();
    }

    pub fn add_image(&self, image: &str) {
        self.inner().images.insert(image.to_string());
    }

    /// The next starts of container `name` exit at once with these codes.
    pub fn exit_on_start(&self, name: &str, codes: &[i32]) {
        self.inner().scripts.entry(name.to_string()).or_default().exits.extend(codes);
    }

    /// While down, every call fails with `Unavailable` and is not recorded.
    pub fn set_down(&self, down: bool) {
        self.inner().down = down;
    }

    /// The runtime goes down when a call named `call` arrives (that call fails too).
    pub fn go_down_at(&self, call: &'static str) {
        self.inner().down_at = Some(call);
    }

    /// How long `ExecSync` takes.
    pub fn set_exec_takes(&self, d: Duration) {
        self.inner().exec_takes = d;
    }

    /// The sandbox dies: it is no longer ready and its containers exit.
    pub fn kill_sandbox(&self, id: &str) {
        let now = nanos(&self.clock);
        let mut inner = self.inner();
        if let Some(s) = inner.sandboxes.iter_mut().find(|s| s.id == id) {
            s.ready = false;
        }
        for c in inner.containers.iter_mut().filter(|c| c.sandbox_id == id) {
            exit(c, 137, now);
        }
    }

    /// The state of container `id`, if the runtime has it.
    pub fn container_state(&self, id: &str) -> Option<cri::ContainerState> {
        self.inner().containers.iter().find(|c| c.id == id).map(|c| c.state)
    }

    /// Runs one call: fails it if the runtime is down, else records
    /// `record` and answers with `answer`.
    fn call<T: Send + 'static>(
        &self,
        name: &'static str,
        record: String,
        answer: impl FnOnce(&mut Inner, i64) -> Result<T, Status>,
    ) -> Call<'_, T> {
        let result = {
            let mut inner = self.inner();
            if inner.down_at == Some(name) {
                inner.down_at = None;
                inner.down = true;
            }
            if inner.down {
                Err(Status::unavailable("connection refused"))
            } else {
                inner.calls.push(record);
                answer(&mut inner, nanos(&self.clock))
            }
        };
        Box::pin(async move { result })
    }
}

fn exit(c: &mut Container, code: i32, now: i64) {
    if c.state != cri::ContainerState::ContainerExited {
        c.state = cri::ContainerState::ContainerExited;
        c.exit_code = code;
        c.finished_at = now;
    }
}

fn sandbox_state(ready: bool) -> i32 {
    if ready { cri::PodSandboxState::SandboxReady as i32 } else { cri::PodSandboxState::SandboxNotready as i32 }
}

fn listed_sandbox(s: &Sandbox) -> cri::PodSandbox {
    cri::PodSandbox {
        id: s.id.clone(),
        metadata: s.config.metadata.clone(),
        state: sandbox_state(s.ready),
        created_at: s.created_at,
        labels: s.config.labels.clone(),
        annotations: s.config.annotations.clone(),
        runtime_handler: s.handler.clone(),
    }
}

fn image_spec(c: &Container) -> Option<cri::ImageSpec> {
    c.config.image.clone()
}

fn listed_container(c: &Container) -> cri::Container {
    cri::Container {
        id: c.id.clone(),
        pod_sandbox_id: c.sandbox_id.clone(),
        metadata: c.config.metadata.clone(),
        image: image_spec(c),
        image_ref: c.config.image.as_ref().map(|i| i.image.clone()).unwrap_or_default(),
        state: c.state as i32,
        created_at: c.created_at,
        labels: c.config.labels.clone(),
        annotations: c.config.annotations.clone(),
        ..Default::default()
    }
}

fn container_status(c: &Container) -> cri::ContainerStatus {
    let exited = c.state == cri::ContainerState::ContainerExited;
    cri::ContainerStatus {
        id: c.id.clone(),
        metadata: c.config.metadata.clone(),
        state: c.state as i32,
        created_at: c.created_at,
        started_at: c.started_at,
        finished_at: c.finished_at,
        exit_code: c.exit_code,
        image: image_spec(c),
        image_ref: c.config.image.as_ref().map(|i| i.image.clone()).unwrap_or_default(),
        reason: match (exited, c.exit_code) {
            (false, _) => String::new(),
            (true, 0) => "Completed".into(),
            (true, _) => "Error".into(),
        },
        labels: c.config.labels.clone(),
        annotations: c.config.annotations.clone(),
        ..Default::default()
    }
}

fn not_found(what: &str, id: &str) -> Status {
    Status::not_found(format!("{what} {id} not found"))
}

impl Cri for FakeRuntime {
    fn list_pod_sandbox(&self, req: cri::ListPodSandboxRequest) -> Call<'_, cri::ListPodSandboxResponse> {
        self.call("ListPodSandbox", "ListPodSandbox".into(), move |inner, _| {
            let selector = req.filter.map(|f| f.label_selector).unwrap_or_default();
            let items =
                inner.sandboxes.iter().filter(|s| matches(&selector, &s.config.labels)).map(listed_sandbox).collect();
            Ok(cri::ListPodSandboxResponse { items })
        })
    }

    fn pod_sandbox_status(&self, req: cri::PodSandboxStatusRequest) -> Call<'_, cri::PodSandboxStatusResponse> {
        let id = req.pod_sandbox_id;
        self.call("PodSandboxStatus", format!("PodSandboxStatus {id}"), move |inner, _| {
            let s = inner.sandboxes.iter().find(|s| s.id == id).ok_or_else(|| not_found("sandbox", &id))?;
            let listed = listed_sandbox(s);
            let status = cri::PodSandboxStatus {
                id: listed.id,
                metadata: listed.metadata,
                state: listed.state,
                created_at: listed.created_at,
                network: Some(cri::PodSandboxNetworkStatus { ip: s.ip.clone(), additional_ips: Vec::new() }),
                labels: listed.labels,
                annotations: listed.annotations,
                runtime_handler: listed.runtime_handler,
                ..Default::default()
            };
            Ok(cri::PodSandboxStatusResponse { status: Some(status), ..Default::default() })
        })
    }

    fn run_pod_sandbox(&self, req: cri::RunPodSandboxRequest) -> Call<'_, cri::RunPodSandboxResponse> {
        let config = req.config.unwrap_or_default();
        let attempt = config.metadata.as_ref().map_or(0, |m| m.attempt);
        let handler = req.runtime_handler;
        let record = format!("RunPodSandbox attempt={attempt} handler={handler}");
        self.call("RunPodSandbox", record, move |inner, now| {
            let id = format!("sandbox-{attempt}");
            let ip = format!("10.88.0.{}", inner.sandboxes.len() + 2);
            inner.sandboxes.push(Sandbox { id: id.clone(), config, handler, ready: true, created_at: now, ip });
            Ok(cri::RunPodSandboxResponse { pod_sandbox_id: id })
        })
    }

    fn stop_pod_sandbox(&self, req: cri::StopPodSandboxRequest) -> Call<'_, cri::StopPodSandboxResponse> {
        let id = req.pod_sandbox_id;
        self.call("StopPodSandbox", format!("StopPodSandbox {id}"), move |inner, now| {
            let s = inner.sandboxes.iter_mut().find(|s| s.id == id).ok_or_else(|| not_found("sandbox", &id))?;
            s.ready = false;
            for c in inner.containers.iter_mut().filter(|c| c.sandbox_id == id) {
                exit(c, 137, now);
            }
            Ok(cri::StopPodSandboxResponse {})
        })
    }

    fn remove_pod_sandbox(&self, req: cri::RemovePodSandboxRequest) -> Call<'_, cri::RemovePodSandboxResponse> {
        let id = req.pod_sandbox_id;
        self.call("RemovePodSandbox", format!("RemovePodSandbox {id}"), move |inner, _| {
            inner.sandboxes.retain(|s| s.id != id);
            inner.containers.retain(|c| c.sandbox_id != id);
            Ok(cri::RemovePodSandboxResponse {})
        })
    }

    fn list_containers(&self, req: cri::ListContainersRequest) -> Call<'_, cri::ListContainersResponse> {
        self.call("ListContainers", "ListContainers".into(), move |inner, _| {
            let selector = req.filter.map(|f| f.label_selector).unwrap_or_default();
            let containers = inner
                .containers
                .iter()
                .filter(|c| matches(&selector, &c.config.labels))
                .map(listed_container)
                .collect();
            Ok(cri::ListContainersResponse { containers })
        })
    }

    fn container_status(&self, req: cri::ContainerStatusRequest) -> Call<'_, cri::ContainerStatusResponse> {
        let id = req.container_id;
        self.call("ContainerStatus", format!("ContainerStatus {id}"), move |inner, _| {
            let c = inner.containers.iter().find(|c| c.id == id).ok_or_else(|| not_found("container", &id))?;
            Ok(cri::ContainerStatusResponse { status: Some(container_status(c)), ..Default::default() })
        })
    }

    fn create_container(&self, req: cri::CreateContainerRequest) -> Call<'_, cri::CreateContainerResponse> {
        let config = req.config.unwrap_or_default();
        let (name, attempt) = config.metadata.as_ref().map_or((String::new(), 0), |m| (m.name.clone(), m.attempt));
        let sandbox_id = req.pod_sandbox_id;
        let image = config.image.as_ref().map(|i| i.image.clone()).unwrap_or_default();
        let record = format!("CreateContainer {name}-{attempt} in {sandbox_id} image={image}");
        self.call("CreateContainer", record, move |inner, now| {
            if !inner.sandboxes.iter().any(|s| s.id == sandbox_id && s.ready) {
                return Err(not_found("sandbox", &sandbox_id));
            }
            let id = format!("{name}-{attempt}");
            if inner.containers.iter().any(|c| c.id == id) {
                return Err(Status::already_exists(format!("container {id} exists")));
            }
            inner.containers.push(Container {
                id: id.clone(),
                sandbox_id,
                config,
                state: cri::ContainerState::ContainerCreated,
                created_at: now,
                started_at: 0,
                finished_at: 0,
                exit_code: 0,
            });
            Ok(cri::CreateContainerResponse { container_id: id })
        })
    }

    fn start_container(&self, req: cri::StartContainerRequest) -> Call<'_, cri::StartContainerResponse> {
        let id = req.container_id;
        self.call("StartContainer", format!("StartContainer {id}"), move |inner, now| {
            let Inner { containers, scripts, .. } = inner;
            let c = containers.iter_mut().find(|c| c.id == id).ok_or_else(|| not_found("container", &id))?;
            c.state = cri::ContainerState::ContainerRunning;
            c.started_at = now;
            let name = c.config.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
            if let Some(code) = scripts.get_mut(&name).and_then(|s| s.exits.pop_front()) {
                exit(c, code, now);
            }
            Ok(cri::StartContainerResponse {})
        })
    }

    fn stop_container(&self, req: cri::StopContainerRequest) -> Call<'_, cri::StopContainerResponse> {
        let (id, timeout) = (req.container_id, req.timeout);
        self.call("StopContainer", format!("StopContainer {id} timeout={timeout}"), move |inner, now| {
            let c = inner.containers.iter_mut().find(|c| c.id == id).ok_or_else(|| not_found("container", &id))?;
            exit(c, 143, now);
            Ok(cri::StopContainerResponse {})
        })
    }

    fn remove_container(&self, req: cri::RemoveContainerRequest) -> Call<'_, cri::RemoveContainerResponse> {
        let id = req.container_id;
        self.call("RemoveContainer", format!("RemoveContainer {id}"), move |inner, _| {
            inner.containers.retain(|c| c.id != id);
            Ok(cri::RemoveContainerResponse {})
        })
    }

    fn exec_sync(&self, req: cri::ExecSyncRequest) -> Call<'_, cri::ExecSyncResponse> {
        let record = format!("ExecSync {} {}", req.container_id, req.cmd.join(" "));
        let takes = self.inner().exec_takes;
        let answer = self.call("ExecSync", record, |_, _| Ok(cri::ExecSyncResponse::default()));
        Box::pin(async move {
            let answer = answer.await;
            tokio::time::sleep(takes).await;
            answer
        })
    }

    fn image_status(&self, req: cri::ImageStatusRequest) -> Call<'_, cri::ImageStatusResponse> {
        let image = req.image.map(|i| i.image).unwrap_or_default();
        self.call("ImageStatus", format!("ImageStatus {image}"), move |inner, _| {
            let found = inner.images.contains(&image).then(|| cri::Image {
                id: format!("sha256:{image}"),
                repo_tags: vec![image.clone()],
                size: 1024,
                ..Default::default()
            });
            Ok(cri::ImageStatusResponse { image: found, ..Default::default() })
        })
    }

    fn pull_image(&self, req: cri::PullImageRequest) -> Call<'_, cri::PullImageResponse> {
        let image = req.image.map(|i| i.image).unwrap_or_default();
        self.call("PullImage", format!("PullImage {image}"), move |inner, _| {
            inner.images.insert(image.clone());
            Ok(cri::PullImageResponse { image_ref: image })
        })
    }

    fn list_images(&self, _: cri::ListImagesRequest) -> Call<'_, cri::ListImagesResponse> {
        self.call("ListImages", "ListImages".into(), |inner, _| {
            let images = inner
                .images
                .iter()
                .map(|i| cri::Image { id: format!("sha256:{i}"), repo_tags: vec![i.clone()], ..Default::default() })
                .collect();
            Ok(cri::ListImagesResponse { images })
        })
    }

    fn remove_image(&self, req: cri::RemoveImageRequest) -> Call<'_, cri::RemoveImageResponse> {
        let image = req.image.map(|i| i.image).unwrap_or_default();
        self.call("RemoveImage", format!("RemoveImage {image}"), move |inner, _| {
            inner.images.remove(&image);
            Ok(cri::RemoveImageResponse {})
        })
    }

    fn image_fs_info(&self, _: cri::ImageFsInfoRequest) -> Call<'_, cri::ImageFsInfoResponse> {
        self.call("ImageFsInfo", "ImageFsInfo".into(), |_, _| Ok(cri::ImageFsInfoResponse::default()))
    }
}
