//! Starting one container: its image (pull policy, pull back-off, pull secrets), its
//! configuration (environment, mounts, `/etc/hosts`, termination message file), create, start,
//! and its postStart hook.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1 as core;
use kube::api::Api;
use tokio::sync::watch;

use super::{MIN_GRACE_SECONDS, Running, Shell, WorkerError, field_path};
use crate::pods::actions::{self, Action, Outcome};
use crate::pods::cri as cricalls;
use crate::pods::env;
use crate::pods::hosts;
use crate::pods::images::{self, PullPolicy};
use crate::pods::spec;
use crate::pods::status::Waiting;
use crate::pods::volumes;
use berth_events as events;

impl Shell {
    /// Pulls, creates and starts one container, then runs its postStart hook. Returns the
    /// container's ID, or `None` when it could not be started for a reason the pod shows (recorded
    /// as its waiting reason).
    pub(super) async fn start_container(
        &mut self,
        r: &mut Running,
        name: &str,
        init: bool,
        restart_count: i32,
    ) -> Result<Option<String>, WorkerError> {
        let Some(c) = self.container_spec(name).cloned() else { return Ok(None) };
        let Some(sandbox) = r.sandbox.held().cloned() else { return Ok(None) };
        let path = field_path(name, init);
        let Some(image_ref) = self.ensure_image(r, &c, &path).await? else { return Ok(None) };
        let sources = self.fetch_sources().await?;
        let ctx = self.pod_context(Some(&sandbox));
        let config_error = |w: &mut Shell, message: String| {
            w.event(events::Type::Warning, &path, "Failed", format!("Error: {message}"));
            w.waiting.insert(name.to_string(), Waiting::new("CreateContainerConfigError", message));
        };
        let env = match env::environment(&self.pod, &c, &ctx, &sources) {
            Ok(env) => env,
            Err(e) => {
                config_error(self, e.to_string());
                return Ok(None);
            }
        };
        let prepared = r.volumes.as_ref().map(|(v, _)| v.clone()).unwrap_or_default();
        let mut mounts = match volumes::container_mounts(&c, &prepared, &env) {
            Ok(m) => m,
            Err(e) => {
                config_error(self, berth_common::error::error_chain(&e));
                return Ok(None);
            }
        };
        if hosts::mounted_for(&c, &ctx.pod_ips) {
            match self.hosts_file(&ctx.pod_ips) {
                Ok(file) => mounts.push(cri::Mount {
                    container_path: hosts::ETC_HOSTS.into(),
                    host_path: file.display().to_string(),
                    ..Default::default()
                }),
                Err(e) => {
                    config_error(self, format!("writing the pod's hosts file: {e}"));
                    return Ok(None);
                }
            }
        }
        let termination_file = self.termination_message_file(&c, restart_count);
        let qos = berth_api::kinds::pod_qos_class(self.spec());
        let config = spec::container_config(spec::ContainerInputs {
            pod: &self.pod,
            container: &c,
            init,
            restart_count,
            image_ref: &image_ref,
            handler: &r.runtime.handler,
            env,
            mounts,
            termination_message_file: termination_file,
            qos,
            memory_capacity: self.ctx.memory_capacity,
        });
        let ep = &r.runtime.endpoint;
        let id = match cricalls::create_container(ep, &sandbox.id, config, &sandbox.config).await {
            Ok(id) => id,
            Err(e) if e.status.code() == tonic::Code::Unavailable => return Err(e.into()),
            Err(e) if matches!(e.status.code(), tonic::Code::Aborted | tonic::Code::NotFound) => {
                // The sandbox is going away under us: look at it again shortly.
                tracing::info!(pod = %self.pod_ref(), container = %name, error = %e.rpc(), "sandbox gone while creating a container");
                r.sandbox_going = true;
                return Ok(None);
            }
            Err(e) => {
                let message = e.rpc();
                self.event(events::Type::Warning, &path, "Failed", format!("Error: {message}"));
                self.waiting.insert(name.to_string(), Waiting::new("CreateContainerError", message));
                return Ok(None);
            }
        };
        self.expected.created(&id);
        self.event(events::Type::Normal, &path, "Created", format!("Created container: {name}"));
        if let Err(e) = cricalls::start_container(ep, &id).await {
            if e.status.code() == tonic::Code::Unavailable {
                return Err(e.into());
            }
            let message = e.rpc();
            self.event(events::Type::Warning, &path, "Failed", format!("Error: {message}"));
            self.waiting.insert(name.to_string(), Waiting::new("RunContainerError", message));
            return Ok(None);
        }
        self.expected.started(&id);
        self.event(events::Type::Normal, &path, "Started", format!("Started container {name}"));
        self.waiting.remove(name);
        tracing::debug!(pod = %self.pod_ref(), container = %name, id, restart_count, "container started");
        if let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let action = Action::of_handler(hook);
            let grace = self.spec().termination_grace_period_seconds.unwrap_or(30);
            let target = self.target(&r.runtime, Some(&sandbox), &id, Some(&c));
            let timeout = Duration::from_secs(u64::try_from(grace.max(MIN_GRACE_SECONDS)).unwrap_or(30));
            if let Outcome::Failure(message) = actions::run(&action, &target, timeout).await {
                let text = actions::hook_failure(&action, name, &self.pod_ref(), &message);
                self.event(events::Type::Warning, &path, "FailedPostStartHook", text);
                self.event(events::Type::Normal, &path, "Killing", "FailedPostStartHook");
                cricalls::stop_container(ep, &id, grace.max(MIN_GRACE_SECONDS)).await?;
            }
        }
        Ok(Some(id))
    }

    /// Pulls (or finds) the container's image per its pull policy; `None` when it cannot be had
    /// now (the reason is recorded).
    async fn ensure_image(
        &mut self,
        r: &mut Running,
        c: &core::Container,
        path: &str,
    ) -> Result<Option<String>, WorkerError> {
        let image = c.image.clone().unwrap_or_default();
        let (ep, handler) = (&r.runtime.endpoint, &r.runtime.handler);
        let policy = images::pull_policy(c);
        if policy != PullPolicy::Always {
            let found = match r.images_looked_up.remove(&image) {
                Some(found) => found,
                None => cricalls::image_status(ep, &image, handler).await?.map(|i| i.id),
            };
            if let Some(found) = found {
                self.event(
                    events::Type::Normal,
                    path,
                    "Pulled",
                    format!("Container image {image:?} already present on machine"),
                );
                return Ok(Some(found));
            }
            if policy == PullPolicy::Never {
                let message = format!("Container image {image:?} is not present with pull policy of Never");
                self.event(events::Type::Warning, path, "ErrImageNeverPull", &message);
                self.waiting.insert(c.name.clone(), Waiting::new("ErrImageNeverPull", message));
                return Ok(None);
            }
        }
        let key = images::pull_key(&image, handler);
        let now = self.now();
        if let Some((failed_at, message)) = self.pull_failures.get(&key).cloned()
            && self.pulls.remaining(&key, failed_at, now).is_some()
        {
            self.event(events::Type::Normal, path, "BackOff", format!("Back-off pulling image {image:?}"));
            self.event(events::Type::Warning, path, "Failed", "Error: ImagePullBackOff");
            let waiting = format!("Back-off pulling image {image:?}: ErrImagePull: {message}");
            self.waiting.insert(c.name.clone(), Waiting::new("ImagePullBackOff", waiting));
            return Ok(None);
        }
        self.event(events::Type::Normal, path, "Pulling", format!("Pulling image {image:?}"));
        let secrets = self.pull_secrets(path).await?;
        let auth = images::credentials(&image, &secrets);
        let sandbox_config = r.sandbox.held().map(|s| s.config.clone()).unwrap_or_default();
        let started = std::time::Instant::now();
        let pull = cricalls::pull_image(ep, &image, handler, auth, &sandbox_config);
        let result = tokio::select! {
            r = pull => r,
            // A pod deleted during a long pull stops waiting for it.
            _ = deletion(self.pods.clone()) => return Ok(None),
        };
        match result {
            Ok(image_ref) => {
                self.pull_failures.remove(&key);
                self.pulls.forget(&key);
                let took = started.elapsed().as_secs_f64();
                let size = cricalls::image_status(ep, &image_ref, handler).await.ok().flatten().map_or(0, |i| i.size);
                self.event(
                    events::Type::Normal,
                    path,
                    "Pulled",
                    format!("Successfully pulled image {image:?} in {took:.3}s ({took:.3}s including waiting). Image size: {size} bytes."),
                );
                Ok(Some(image_ref))
            }
            Err(e) if e.status.code() == tonic::Code::Unavailable => Err(e.into()),
            Err(e) => {
                let message = e.rpc();
                self.event(events::Type::Warning, path, "Failed", format!("Failed to pull image {image:?}: {message}"));
                self.event(events::Type::Warning, path, "Failed", "Error: ErrImagePull");
                let at = self.now();
                self.pulls.attempt(&key, at, at);
                self.pull_failures.insert(key, (at, message.clone()));
                self.waiting.insert(c.name.clone(), Waiting::new("ErrImagePull", message));
                Ok(None)
            }
        }
    }

    async fn pull_secrets(&self, path: &str) -> Result<Vec<core::Secret>, WorkerError> {
        let names: Vec<String> =
            self.spec().image_pull_secrets.iter().flatten().map(|r| r.name.clone()).filter(|n| !n.is_empty()).collect();
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let (_, ns) = self.names();
        let api: Api<core::Secret> = Api::namespaced(self.ctx.client.clone(), &ns);
        let (mut found, mut missing) = (Vec::new(), Vec::new());
        for name in names {
            match api.get_opt(&name).await {
                Ok(Some(s)) => found.push(s),
                Ok(None) => missing.push(name),
                Err(source) => {
                    return Err(WorkerError::Api {
                        action: "reading an image pull secret",
                        pod: self.pod_ref(),
                        source,
                    });
                }
            }
        }
        if !missing.is_empty() {
            self.event(
                events::Type::Warning,
                path,
                "FailedToRetrieveImagePullSecret",
                format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                    missing.join(", ")
                ),
            );
        }
        Ok(found)
    }

    /// The pod's `/etc/hosts` on the node, written once (as kubelet does) and shared by its
    /// containers.
    fn hosts_file(&self, pod_ips: &[String]) -> std::io::Result<PathBuf> {
        let file = volumes::pod_dir(&self.ctx.root_dir, &self.uid).join("etc-hosts");
        if !file.exists() {
            let node_hosts = std::fs::read_to_string(hosts::ETC_HOSTS).unwrap_or_default();
            let tmp = file.with_extension("tmp");
            std::fs::create_dir_all(file.parent().unwrap_or(&self.ctx.root_dir))?;
            std::fs::write(&tmp, hosts::content(&self.pod, pod_ips, &node_hosts, &self.ctx.dns.cluster_domain))?;
            std::fs::rename(&tmp, &file)?;
        }
        Ok(file)
    }

    /// Creates the host file for the container's termination message; `None` when it has none.
    fn termination_message_file(&self, c: &core::Container, restart_count: i32) -> Option<PathBuf> {
        if c.termination_message_path.as_deref() == Some("") {
            return None;
        }
        let dir = volumes::pod_dir(&self.ctx.root_dir, &self.uid).join("containers").join(&c.name);
        let file = dir.join(restart_count.to_string());
        let made = std::fs::create_dir_all(&dir).and_then(|_| std::fs::File::create(&file)).and_then(|_| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666))
        });
        match made {
            Ok(()) => Some(file),
            Err(e) => {
                tracing::warn!(pod = %self.pod_ref(), container = %c.name, error = %e, "no termination message file");
                None
            }
        }
    }
}

/// Resolves once the pod is being deleted or left the API (or the supervisor is gone).
async fn deletion(mut pods: watch::Receiver<Option<Arc<core::Pod>>>) {
    let _ = pods.wait_for(|p| p.as_ref().is_none_or(|p| p.metadata.deletion_timestamp.is_some())).await;
}
