//! The pod's sandbox: asked about while held, found again after an agent restart, created (with
//! the pod's cgroup) when there is none, and re-created, `attempt` + 1, when it died.

use std::collections::HashMap;
use std::time::Duration;

use k8s_cri::v1 as cri;

use super::{MIN_GRACE_SECONDS, Next, PodRuntime, PodSandbox, Running, Sandbox, Shell, WorkerError};
use crate::endpoint::Endpoint;
use crate::pods::cgroups;
use crate::pods::cri::{self as cricalls, CriError};
use crate::pods::images::{self, PullPolicy};
use crate::pods::spec;
use crate::pods::status::{Instance, InstanceState};
use berth_events as events;

pub(super) enum SandboxOutcome {
    Ready,
    /// Could not be created: try again then.
    Retry(Next),
    /// Its containers ran under `restartPolicy: Never`: not created again.
    NotRecreated,
}

impl Shell {
    /// Whether the sandbox held is still ready; marks it not ready when it is not.
    pub(super) async fn check_sandbox(&mut self, r: &mut Running) -> Result<bool, WorkerError> {
        let PodSandbox::Held(sb) = &mut r.sandbox else { return Ok(false) };
        let status = cricalls::sandbox_status(&r.runtime.endpoint, &sb.id).await?;
        let ready = status.as_ref().is_some_and(|s| s.state == cri::PodSandboxState::SandboxReady as i32);
        if !ready {
            sb.ready = false;
        }
        Ok(ready)
    }

    /// Finds the pod's ready sandbox, or creates one (`attempt` after the newest).
    pub(super) async fn ensure_sandbox(
        &mut self,
        r: &mut Running,
        instances: &[Instance],
    ) -> Result<SandboxOutcome, WorkerError> {
        let runtime = r.runtime.clone();
        let ep = &runtime.endpoint;
        let mut sandboxes = match r.sandbox {
            PodSandbox::NothingOnNode => Vec::new(),
            _ => cricalls::list_sandboxes(ep, Some(&self.uid)).await?,
        };
        sandboxes.sort_by_key(|s| std::cmp::Reverse((s.metadata.as_ref().map_or(0, |m| m.attempt), s.created_at)));
        let ready = sandboxes.iter().find(|s| s.state == cri::PodSandboxState::SandboxReady as i32);
        if let Some(found) = ready {
            let attempt = found.metadata.as_ref().map_or(0, |m| m.attempt);
            let config =
                spec::sandbox_config(&self.pod, attempt, &self.ctx.pod_log_dir, &self.ctx.dns, &self.cgroup_path());
            let ips = sandbox_ips(cricalls::sandbox_status(ep, &found.id).await?.as_ref());
            tracing::info!(pod = %self.pod_ref(), sandbox = %found.id, "found the pod's sandbox");
            r.sandbox = PodSandbox::JustSeen(Sandbox { id: found.id.clone(), config, ips, ready: true });
            return Ok(SandboxOutcome::Ready);
        }
        let policy = self.spec().restart_policy.as_deref().unwrap_or("Always");
        if !sandboxes.is_empty() && policy == "Never" && !instances.is_empty() {
            // Its containers ran and must not run again: the pod ends with what they did.
            r.sandbox = PodSandbox::None;
            return Ok(SandboxOutcome::NotRecreated);
        }
        if !sandboxes.is_empty() {
            self.event(
                events::Type::Normal,
                "",
                "SandboxChanged",
                "Pod sandbox changed, it will be killed and re-created.",
            );
            for i in instances.iter().filter(|i| i.state == InstanceState::Running) {
                cricalls::stop_container(ep, &i.id, MIN_GRACE_SECONDS).await?;
            }
            for s in &sandboxes {
                cricalls::stop_sandbox(ep, &s.id).await?;
            }
        }
        let attempt = sandboxes.first().map_or(0, |s| s.metadata.as_ref().map_or(0, |m| m.attempt) + 1);
        let created = self.begin_sandbox(r, attempt).run().await;
        self.finish_sandbox(r, created)
    }

    /// Makes the pod's cgroup and the config of its new sandbox (`attempt`); the creation itself
    /// is [`SandboxCreation::run`], which borrows nothing of the worker and may run beside its
    /// other steps.
    pub(super) fn begin_sandbox(&mut self, r: &mut Running, attempt: u32) -> SandboxCreation {
        let cgroup = self.create_cgroup();
        let config = spec::sandbox_config(&self.pod, attempt, &self.ctx.pod_log_dir, &self.ctx.dns, &cgroup);
        // From here on, a sandbox may exist: later steps list what there is.
        if matches!(r.sandbox, PodSandbox::NothingOnNode) {
            r.sandbox = PodSandbox::None;
        }
        SandboxCreation { runtime: r.runtime.clone(), config, images: self.first_images() }
    }

    /// Takes what a [`SandboxCreation`] ended with into the pod's state.
    pub(super) fn finish_sandbox(
        &mut self,
        r: &mut Running,
        created: SandboxCreated,
    ) -> Result<SandboxOutcome, WorkerError> {
        r.images_looked_up = created.looked_up;
        let handler = &r.runtime.handler;
        match created.result {
            Ok((id, status)) => {
                let ips = sandbox_ips(status?.as_ref());
                tracing::info!(pod = %self.pod_ref(), sandbox = %id, handler = %handler, endpoint = %r.runtime.endpoint.name, took = ?created.took, "sandbox created");
                r.sandbox = PodSandbox::JustSeen(Sandbox { id, config: created.config, ips, ready: true });
                Ok(SandboxOutcome::Ready)
            }
            Err(e) if e.status.code() == tonic::Code::Unavailable => Err(e.into()),
            Err(e) => {
                self.event(
                    events::Type::Warning,
                    "",
                    "FailedCreatePodSandBox",
                    format!("Failed to create pod sandbox: {}", e.rpc()),
                );
                Ok(SandboxOutcome::Retry(Next::After(Duration::from_secs(5))))
            }
        }
    }

    /// The images of the containers a new sandbox starts first (the first init container, or
    /// else every container) that are looked up before a pull; each once.
    fn first_images(&self) -> Vec<String> {
        let spec = self.spec();
        let first = match spec.init_containers.as_deref() {
            Some([init, ..]) => std::slice::from_ref(init),
            _ => spec.containers.as_slice(),
        };
        let mut out: Vec<String> = Vec::new();
        for c in first.iter().filter(|c| images::pull_policy(c) != PullPolicy::Always) {
            let image = c.image.clone().unwrap_or_default();
            if !out.contains(&image) {
                out.push(image);
            }
        }
        out
    }

    /// The pod's cgroup (kubelet's cgroupfs layout by QoS class).
    fn cgroup_path(&self) -> String {
        cgroups::pod_path(berth_api::kinds::pod_qos_class(self.spec()), &self.uid)
    }

    /// Creates the pod's cgroup with its summed resources and overhead; on failure (no cgroupfs
    /// to write), the runtime's own cgroup is used instead: `""`.
    fn create_cgroup(&self) -> String {
        let path = self.cgroup_path();
        // A pod asking for nothing still gets kubelet's minimum shares.
        let limits = crate::pods::resources::pod_resources(self.spec())
            .unwrap_or(cri::LinuxContainerResources { cpu_shares: 2, ..Default::default() });
        match self.ctx.cgroups.create(&path, &limits) {
            Ok(()) => path,
            Err(e) => {
                tracing::warn!(pod = %self.pod_ref(), cgroup = %path, error = %e, "no pod cgroup; the runtime's is used");
                String::new()
            }
        }
    }
}

/// A sandbox to create: what the creation needs, owned.
pub(super) struct SandboxCreation {
    runtime: PodRuntime,
    config: cri::PodSandboxConfig,
    /// Images looked up while the sandbox is made (see [`Shell::first_images`]).
    images: Vec<String>,
}

/// How a [`SandboxCreation`] ended.
pub(super) struct SandboxCreated {
    config: cri::PodSandboxConfig,
    /// The sandbox's ID and its status (asked right after).
    result: Result<(String, Result<Option<cri::PodSandboxStatus>, CriError>), CriError>,
    looked_up: HashMap<String, Option<String>>,
    took: Duration,
}

impl SandboxCreation {
    pub(super) async fn run(self) -> SandboxCreated {
        let started = std::time::Instant::now();
        let ep = &self.runtime.endpoint;
        let create = async {
            let id = cricalls::run_sandbox(ep, self.config.clone(), &self.runtime.handler).await?;
            let status = cricalls::sandbox_status(ep, &id).await;
            Ok::<_, CriError>((id, status))
        };
        // The sandbox takes tens of milliseconds: the first containers' images are looked up
        // meanwhile instead of after it.
        let (result, looked_up) = tokio::join!(create, look_up_images(ep, self.images.clone(), &self.runtime.handler));
        SandboxCreated { config: self.config, result, looked_up, took: started.elapsed() }
    }
}

/// Asks `ep` about each image at once: image → its ID (`None`: not present). An image whose
/// lookup failed is left out, to be asked again when needed.
async fn look_up_images(ep: &Endpoint, images: Vec<String>, handler: &str) -> HashMap<String, Option<String>> {
    let lookups = images.into_iter().map(|image| async move {
        let found = cricalls::image_status(ep, &image, handler).await;
        (image, found)
    });
    let mut out = HashMap::new();
    for (image, found) in futures::future::join_all(lookups).await {
        if let Ok(found) = found {
            out.insert(image, found.map(|i| i.id));
        }
    }
    out
}

/// The sandbox's IPs, primary first.
fn sandbox_ips(status: Option<&cri::PodSandboxStatus>) -> Vec<String> {
    let Some(net) = status.and_then(|s| s.network.as_ref()) else { return Vec::new() };
    let mut ips: Vec<String> = Some(net.ip.clone()).filter(|ip| !ip.is_empty()).into_iter().collect();
    ips.extend(net.additional_ips.iter().map(|ip| ip.ip.clone()).filter(|ip| !ip.is_empty()));
    ips
}
