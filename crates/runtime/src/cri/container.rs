//! CRI container verbs: CreateContainer, StartContainer, StopContainer, RemoveContainer,
//! ListContainers, ContainerStatus, UpdateContainerResources, ReopenContainerLog and ExecSync, plus
//! the exit watcher that turns a monitor's `exit.json` into the record's exit.
//!
//! A container's directory (`<root>/containers/<id>/`) holds, next to its record: `bundle/`
//! (`config.json` and the `rootfs` overlay mount point), `upper/` and `work/` (the overlay's
//! writable layer), `monitor/` (the monitor's state, see [`crate::reality`]) and `init.pid`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use berth_image::ImageRecord;
use berth_oci::spec::{self as oci_spec_gen, ContainerSpec, NamespaceMode};
use berth_oci::{CreateOptions, ExecOptions, OciError};
use berth_stream::TerminalSize;
use k8s_cri::v1 as cri;
use nix::sys::signal::Signal;
use serde_json::json;

use super::stats::spec_cgroup;
use super::{Cri, Error};
use crate::config::{Isolation, RuntimeHandler};
use crate::host;
use crate::reality::monitor_dir;
use crate::state::{ContainerFilter, ContainerRecord, ContainerState, Exit, SandboxRecord, StateError, now_ns};

/// How long StopContainer waits for a SIGKILLed container's exit to be recorded.
const KILL_GRACE: Duration = Duration::from_secs(10);
/// Most output ExecSync keeps per stream (kubelet's limit).
const MAX_EXEC_OUTPUT: usize = 16 * 1024 * 1024;

impl Cri {
    pub async fn create_container(
        self: &Arc<Self>,
        req: cri::CreateContainerRequest,
    ) -> Result<cri::CreateContainerResponse, Error> {
        let config = req.config.ok_or_else(|| Error::InvalidArgument("CreateContainer: config is required".into()))?;
        let sandbox = self.store.sandbox(&req.pod_sandbox_id)?;
        let image_name = config.image.as_ref().map(|i| i.image.clone()).unwrap_or_default();
        if image_name.is_empty() {
            return Err(Error::InvalidArgument("CreateContainer: config.image.image is required".into()));
        }
        let handler = self.handler(&sandbox.runtime_handler)?;
        let (name, h) = (image_name.clone(), handler.name.clone());
        let default = self.config.default_handler.clone();
        let image = self
            .blocking(move |images| {
                let found = images.status(&name, &h).map_err(|e| Error::image("find", &name, &h, e))?;
                // Clients that pull without a handler (kubelet without RuntimeClassInImageCriApi,
                // crictl, critest) pulled for the default handler: that image serves any handler
                // with the same guest platform, as it resolved to the same manifest.
                if found.is_none() && h != default {
                    let same_platform = matches!(
                        (images.platform(&h), images.platform(&default)),
                        (Ok(a), Ok(b)) if a == b
                    );
                    if same_platform {
                        return images.status(&name, &default).map_err(|e| Error::image("find", &name, &default, e));
                    }
                }
                Ok(found)
            })
            .await?
            .ok_or_else(|| Error::ImageNotFound { image: image_name.clone(), handler: handler.name.clone() })?;
        let layers = {
            let image = image.clone();
            self.blocking(move |images| images.layer_dirs(&image).map_err(|e| Error::image("find", &image.id, "", e)))
                .await?
        };

        let mut record = ContainerRecord::new(&config, &sandbox, now_ns())?;
        record.image_id = image.id.clone();
        record.image_ref = image.repo_digests.first().cloned().unwrap_or_else(|| image.id.clone());
        let store = self.store.clone();
        let claim = self.blocking_state(move || store.create_container(record)).await?;
        let id = claim.id().to_string();
        match self.setup_container(claim.record(), &sandbox, &handler, &config, &image, &layers).await {
            Ok(bundle) => {
                let (_, record) = self
                    .blocking_state(move || {
                        claim.commit(|c| {
                            c.bundle = bundle;
                            Ok(())
                        })
                    })
                    .await?;
                self.emit(&record, cri::ContainerEventType::ContainerCreatedEvent);
                tracing::info!(container = %id, sandbox = %sandbox.id, "container created");
                Ok(cri::CreateContainerResponse { container_id: id })
            }
            Err(e) => {
                self.cleanup_container_files(&id, Some(&handler)).await;
                self.blocking_state(move || claim.remove().map(drop)).await?;
                Err(e)
            }
        }
    }

    /// Rootfs, `config.json` and log directory. The OCI container itself is made by StartContainer
    /// (as containerd creates its task there): one `run --detach` instead of `create` + `start`.
    async fn setup_container(
        &self,
        record: &ContainerRecord,
        sandbox: &SandboxRecord,
        handler: &RuntimeHandler,
        config: &cri::ContainerConfig,
        image: &ImageRecord,
        layers: &[PathBuf],
    ) -> Result<PathBuf, Error> {
        let dir = self.store.container_dir(&record.id);
        let bundle = dir.join("bundle");
        let rootfs = bundle.join("rootfs");
        let host_err = |what: &str| {
            let what = format!("{what} of container {}", record.id);
            move |source| Error::Host { what, source }
        };
        host::mount_overlay(layers, &dir.join("upper"), &dir.join("work"), &rootfs).map_err(host_err("the rootfs"))?;
        let spec = self.container_spec(record, sandbox, handler, config, image, &rootfs)?;
        let oci = oci_spec_gen::container_spec(&spec)
            .map_err(|e| Error::Spec { id: record.id.clone(), source: Box::new(e) })?;
        let text = serde_json::to_vec_pretty(&oci).expect("a spec serializes");
        std::fs::write(bundle.join("config.json"), text).map_err(host_err("writing config.json"))?;
        if let Some(parent) = Path::new(&record.log_path).parent().filter(|_| !record.log_path.is_empty()) {
            std::fs::create_dir_all(parent).map_err(host_err("creating the log directory"))?;
        }
        Ok(bundle)
    }

    /// The monitor running the OCI runtime's `run --detach`: returns once the process runs.
    async fn launch_monitor(
        &self,
        record: &ContainerRecord,
        handler: &RuntimeHandler,
    ) -> Result<berth_monitor::MonitorHandle, Error> {
        let config = record.container_config()?;
        let runtime = handler.oci();
        let dir = self.store.container_dir(&record.id);
        let pid_file = dir.join("init.pid");
        let mut create = CreateOptions::new(dir.join("bundle")).pid_file(&pid_file);
        // A terminal: the OCI runtime hands its master to the monitor.
        let console_socket = config.tty.then(|| console_socket(&record.id));
        if let Some(socket) = &console_socket {
            create = create.console_socket(socket);
        }
        let run = runtime.run_detached_args(&record.id, &create);
        let options = berth_monitor::LaunchOptions {
            monitor_binary: self.monitor_binary.clone(),
            id: record.id.clone(),
            state_dir: monitor_dir(self.store.root(), &record.id),
            log_path: (!record.log_path.is_empty()).then(|| PathBuf::from(&record.log_path)),
            pid_file,
            create_command: run,
            stdin: config.stdin,
            stdin_once: config.stdin_once,
            attach_socket: Some(attach_socket(&record.id)),
            console_socket,
        };
        let id = record.id.clone();
        tokio::task::spawn_blocking(move || berth_monitor::launch(&options))
            .await
            .map_err(Error::Task)?
            .map_err(|e| Error::Monitor { id, source: Box::new(e) })
    }

    /// The spec's inputs from the CRI configs, the image and the sandbox.
    fn container_spec(
        &self,
        record: &ContainerRecord,
        sandbox: &SandboxRecord,
        handler: &RuntimeHandler,
        config: &cri::ContainerConfig,
        image: &ImageRecord,
        rootfs: &Path,
    ) -> Result<ContainerSpec, Error> {
        let invalid = |m: String| Error::InvalidArgument(format!("container {:?}: {m}", record.metadata.name));
        let pod = &sandbox.pod_config()?;
        // Each container its own sandbox: no infra process whose namespaces it could join.
        let own_sandbox = handler.isolation == Isolation::SandboxPerContainer;
        let linux = config.linux.clone().unwrap_or_default();
        let sc = linux.security_context.clone().unwrap_or_default();
        let image_config = &image.config["config"];
        let strings = |v: &serde_json::Value| -> Vec<String> {
            v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect()).unwrap_or_default()
        };
        let files = self.sandbox_files_dir(&sandbox.id);
        let shm = files.join("shm");

        // Namespaces: the container's own options, else the pod's.
        let modes = sc.namespace_options.clone().unwrap_or_else(|| cri::NamespaceOption {
            network: sandbox.namespaces.network,
            pid: sandbox.namespaces.pid,
            ipc: sandbox.namespaces.ipc,
            ..Default::default()
        });
        let node = cri::NamespaceMode::Node as i32;
        let infra_ns = |kind: &str| sandbox.infra_pid.map(|pid| NamespaceMode::Path(host::namespace_path(pid, kind)));
        let network = if sandbox.namespaces.host_network() {
            NamespaceMode::Host
        } else {
            match &sandbox.netns_path {
                Some(p) => NamespaceMode::Path(p.clone()),
                None => return Err(invalid("the pod sandbox has no network namespace".into())),
            }
        };
        let pid = match cri::NamespaceMode::try_from(modes.pid) {
            Ok(cri::NamespaceMode::Node) => NamespaceMode::Host,
            Ok(cri::NamespaceMode::Pod) if !own_sandbox => infra_ns("pid").unwrap_or_default(),
            Ok(cri::NamespaceMode::Target) => {
                let target = self.store.container(&modes.target_id)?;
                let pid =
                    target.pid.ok_or_else(|| invalid(format!("target container {} has no process", target.id)))?;
                NamespaceMode::Path(host::namespace_path(pid, "pid"))
            }
            _ => NamespaceMode::New,
        };
        let ipc = if sandbox.namespaces.ipc == node {
            NamespaceMode::Host
        } else if own_sandbox {
            NamespaceMode::New
        } else {
            infra_ns("ipc").unwrap_or_default()
        };
        let uts = if sandbox.namespaces.host_network() {
            NamespaceMode::Host
        } else if own_sandbox {
            NamespaceMode::New
        } else {
            infra_ns("uts").unwrap_or_default()
        };

        let mut mounts = Vec::new();
        for m in &config.mounts {
            if m.container_path.is_empty() || m.host_path.is_empty() {
                return Err(invalid("a mount needs both container_path and host_path".into()));
            }
            let host_path = PathBuf::from(&m.host_path);
            if !host_path.is_absolute() {
                return Err(invalid(format!("mount host path {:?} is not absolute", m.host_path)));
            }
            // As containerd: a missing host path becomes a directory.
            if !host_path.exists() {
                std::fs::create_dir_all(&host_path).map_err(|e| {
                    invalid(format!("mount host path {:?} does not exist and cannot be created: {e}", m.host_path))
                })?;
            }
            mounts.push(oci_spec_gen::Mount {
                container_path: m.container_path.clone(),
                host_path,
                readonly: m.readonly,
                propagation: match cri::MountPropagation::try_from(m.propagation) {
                    Ok(cri::MountPropagation::PropagationHostToContainer) => oci_spec_gen::Propagation::HostToContainer,
                    Ok(cri::MountPropagation::PropagationBidirectional) => oci_spec_gen::Propagation::Bidirectional,
                    _ => oci_spec_gen::Propagation::Private,
                },
                options: Vec::new(),
            });
        }

        if sc.run_as_group.is_some() && sc.run_as_user.is_none() && sc.run_as_username.is_empty() {
            return Err(invalid("run_as_group is set without run_as_user or run_as_username".into()));
        }
        let r = linux.resources.clone().unwrap_or_default();
        let caps = sc.capabilities.clone().unwrap_or_default();
        let seccomp = seccomp_profile(&sc).map_err(invalid)?;
        let allowed = &handler.allowed_annotations;
        let annotations = pod
            .annotations
            .iter()
            .chain(config.annotations.iter())
            .filter(|(k, _)| allowed.iter().any(|a| k.starts_with(a.trim_end_matches('*'))))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let pod_linux = pod.linux.clone().unwrap_or_default();
        Ok(ContainerSpec {
            id: record.id.clone(),
            pod_id: sandbox.id.clone(),
            rootfs: rootfs.to_path_buf(),
            readonly_rootfs: sc.readonly_rootfs,
            image: oci_spec_gen::ImageConfig {
                entrypoint: strings(&image_config["Entrypoint"]),
                cmd: strings(&image_config["Cmd"]),
                env: strings(&image_config["Env"]),
                working_dir: image_config["WorkingDir"].as_str().unwrap_or_default().to_string(),
                user: image_config["User"].as_str().unwrap_or_default().to_string(),
            },
            command: config.command.clone(),
            args: config.args.clone(),
            // As containerd: a terminal says what it is, unless the container says otherwise.
            env: config
                .tty
                .then(|| ("TERM".to_string(), "xterm".to_string()))
                .into_iter()
                .chain(config.envs.iter().map(|e| (e.key.clone(), e.value.clone())))
                .collect(),
            working_dir: (!config.working_dir.is_empty()).then(|| config.working_dir.clone()),
            tty: config.tty,
            hostname: (!pod.hostname.is_empty()).then(|| pod.hostname.clone()),
            user: oci_spec_gen::UserConfig {
                run_as_user: sc.run_as_user.as_ref().and_then(|u| u32::try_from(u.value).ok()),
                run_as_username: (!sc.run_as_username.is_empty()).then(|| sc.run_as_username.clone()),
                run_as_group: sc.run_as_group.as_ref().and_then(|g| u32::try_from(g.value).ok()),
                supplemental_groups: sc.supplemental_groups.iter().filter_map(|g| u32::try_from(*g).ok()).collect(),
            },
            privileged: sc.privileged,
            no_new_privileges: sc.no_new_privs,
            add_capabilities: caps.add_capabilities.clone(),
            drop_capabilities: caps.drop_capabilities.clone(),
            seccomp,
            masked_paths: (!sc.masked_paths.is_empty()).then(|| sc.masked_paths.clone()),
            readonly_paths: (!sc.readonly_paths.is_empty()).then(|| sc.readonly_paths.clone()),
            mounts,
            sandbox_files: oci_spec_gen::SandboxFiles {
                hosts: Some(files.join("hosts")),
                resolv_conf: Some(files.join("resolv.conf")),
                hostname: Some(files.join("hostname")),
                shm: (ipc != NamespaceMode::Host && host::is_mounted(&shm)).then_some(shm),
            },
            namespaces: oci_spec_gen::Namespaces { pid, ipc, uts, network, ..Default::default() },
            resources: resources(&r),
            cgroup_parent: (!sandbox.cgroup_parent.is_empty()).then(|| sandbox.cgroup_parent.clone()),
            sysctls: pod_linux.sysctls.into_iter().collect(),
            devices: config
                .devices
                .iter()
                .map(|d| oci_spec_gen::Device {
                    container_path: d.container_path.clone(),
                    host_path: PathBuf::from(&d.host_path),
                    permissions: d.permissions.clone(),
                })
                .collect(),
            annotations,
            runtime_gaps: handler.gaps.clone(),
        })
    }

    pub async fn start_container(
        self: &Arc<Self>,
        req: cri::StartContainerRequest,
    ) -> Result<cri::StartContainerResponse, Error> {
        let claim = self.store.begin_start_container(&req.container_id)?;
        let record = claim.record().clone();
        // Taken before the OCI runtime runs: the process starts within that call, and may even
        // have exited by its end, so a later timestamp could come after its `finished_at`.
        let started_at = now_ns();
        let launched = match (record.monitor_pid, self.handler(&record.handler)) {
            // Created by an older berth, whose CreateContainer ran the OCI `create`.
            (Some(monitor_pid), handler) => {
                let runtime = handler?.oci().clone();
                let id = record.id.clone();
                tokio::task::spawn_blocking(move || runtime.start(&id))
                    .await
                    .map_err(Error::Task)?
                    .map(|()| berth_monitor::MonitorHandle { monitor_pid, container_pid: record.pid.unwrap_or(0) })
                    .map_err(|e| Error::Oci { op: "start", id: record.id.clone(), source: Box::new(e) })
            }
            (None, Ok(handler)) => self.launch_monitor(&record, &handler).await,
            (None, Err(e)) => Err(e),
        };
        let handle = match launched {
            Ok(handle) => handle,
            Err(e) => {
                // containerd's rule: a container that failed to start is exited (128, StartError).
                let exit = Exit::start_error(now_ns(), e.full_message());
                if let Ok((_, record)) = self.blocking_state(move || claim.commit(|c| c.mark_exited(exit))).await {
                    self.emit(&record, cri::ContainerEventType::ContainerStoppedEvent);
                }
                return Err(e);
            }
        };
        let (_, record) = self
            .blocking_state(move || {
                claim.commit(|c| {
                    c.monitor_pid = Some(handle.monitor_pid);
                    c.start((handle.container_pid > 0).then_some(handle.container_pid), started_at)
                })
            })
            .await?;
        self.watch_exit(&record.id, handle.monitor_pid);
        self.emit(&record, cri::ContainerEventType::ContainerStartedEvent);
        tracing::info!(container = %record.id, "container started");
        Ok(cri::StartContainerResponse {})
    }

    /// Records the container's exit once its monitor ends, and tells StopContainer.
    pub(crate) fn watch_exit(self: &Arc<Self>, id: &str, monitor_pid: i32) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        self.exits.lock().unwrap_or_else(|e| e.into_inner()).insert(id.to_string(), rx);
        let cri = Arc::clone(self);
        let id = id.to_string();
        tokio::spawn(async move {
            if let Err(e) = host::wait_for_exit(monitor_pid).await {
                tracing::warn!(container = %id, error = %e, "waiting for the monitor failed; polling");
                while berth_monitor::is_alive(monitor_pid) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            cri.record_exit(&id).await;
            let _ = tx.send(true);
            cri.exits.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            cri.delete_exited(&id).await;
        });
    }

    /// Deletes the OCI container of an exited one right away, as containerd does on a task's
    /// exit, so that RemoveContainer does not pay for it (runsc takes over a second).
    /// RemoveContainer waits for a deletion still running.
    async fn delete_exited(&self, id: &str) {
        let Ok(record) = self.store.container(id) else { return };
        let Ok(handler) = self.handler(&record.handler) else { return };
        let runtime = handler.oci().clone();
        let (tx, rx) = tokio::sync::watch::channel(None);
        self.oci_deletes.lock().unwrap_or_else(|e| e.into_inner()).insert(id.to_string(), rx);
        let id_owned = id.to_string();
        let deleted = tokio::task::spawn_blocking(move || runtime.delete(&id_owned, true)).await;
        let ok = matches!(deleted, Ok(Ok(()) | Err(OciError::NotFound { .. })));
        if !ok {
            tracing::debug!(container = %id, ?deleted, "deleting the exited OCI container failed; remove retries");
        }
        let _ = tx.send(Some(ok));
    }

    /// Reads the monitor's `exit.json` into the record (unless an exit is already recorded).
    async fn record_exit(&self, id: &str) {
        let dir = monitor_dir(self.store.root(), id);
        let exit = match berth_monitor::read_exit(&dir) {
            Ok(Some(e)) => {
                let at = crate::reality::parse_rfc3339_ns(&e.finished_at).unwrap_or_else(now_ns);
                Exit::observed(e.exit_code, at, e.oom_killed)
            }
            Ok(None) => Exit::unknown(now_ns(), "the container's monitor exited without recording the exit"),
            Err(e) => Exit::unknown(now_ns(), format!("reading the container's exit: {e}")),
        };
        let store = self.store.clone();
        let id_owned = id.to_string();
        let updated = self
            .blocking_state(move || {
                store.update_container(&id_owned, |c| {
                    if c.state().can_mark_exited() { c.mark_exited(exit).map(|_| true) } else { Ok(false) }
                })
            })
            .await;
        match updated {
            Ok((true, record)) => {
                tracing::info!(container = %id, exit_code = record.exit_code(), reason = record.reason(), "container exited");
                self.emit(&record, cri::ContainerEventType::ContainerStoppedEvent);
            }
            Ok((false, _)) | Err(StateError::NotFound { .. }) => {}
            Err(e) => tracing::error!(container = %id, error = %e, "recording a container's exit failed"),
        }
    }

    pub async fn stop_container(
        self: &Arc<Self>,
        req: cri::StopContainerRequest,
    ) -> Result<cri::StopContainerResponse, Error> {
        let record = self.store.container(&req.container_id)?;
        let handler = self.handler(&record.handler).ok();
        self.stop_container_now(&record.id, handler.as_deref(), req.timeout).await?;
        Ok(cri::StopContainerResponse {})
    }

    /// The image's stop signal (SIGTERM by default), up to `timeout` seconds for the exit, then
    /// SIGKILL. A container that is not running is left as it is. `handler` is the container's,
    /// `None` when it is no longer configured.
    pub(crate) async fn stop_container_now(
        self: &Arc<Self>,
        id: &str,
        handler: Option<&RuntimeHandler>,
        timeout: i64,
    ) -> Result<(), Error> {
        let record = self.store.container(id)?;
        if !record.state().can_stop() {
            return Ok(());
        }
        let mut exited = self.exit_receiver(&record);
        let Some(rx) = exited.as_mut() else {
            // No monitor to wait for: nothing can record an exit but us.
            let exit = Exit::unknown(now_ns(), "stopped without a monitor to observe the exit");
            let store = self.store.clone();
            let id = record.id.clone();
            self.blocking_state(move || store.update_container(&id, |c| c.mark_exited(exit))).await?;
            return Ok(());
        };
        if timeout > 0 {
            let signal = self.stop_signal(&record);
            self.signal(&record, handler, signal, false).await?;
            let wait = tokio::time::timeout(Duration::from_secs(timeout as u64), rx.wait_for(|done| *done)).await;
            if wait.is_ok() {
                return Ok(());
            }
        }
        self.signal(&record, handler, Signal::SIGKILL, true).await?;
        match tokio::time::timeout(KILL_GRACE, rx.wait_for(|done| *done)).await {
            Ok(_) => Ok(()),
            Err(_) => {
                Err(Error::Timeout(format!("container {} did not exit within {KILL_GRACE:?} of SIGKILL", record.id)))
            }
        }
    }

    /// A receiver that turns true once the container's exit is recorded; starts a watcher if none
    /// runs (an `Unknown` container after a restart). `None` when there is no monitor.
    pub(crate) fn exit_receiver(
        self: &Arc<Self>,
        record: &ContainerRecord,
    ) -> Option<tokio::sync::watch::Receiver<bool>> {
        if let Some(rx) = self.exits.lock().unwrap_or_else(|e| e.into_inner()).get(&record.id) {
            return Some(rx.clone());
        }
        let monitor_pid = record.monitor_pid.filter(|p| berth_monitor::is_alive(*p))?;
        self.watch_exit(&record.id, monitor_pid);
        self.exits.lock().unwrap_or_else(|e| e.into_inner()).get(&record.id).cloned()
    }

    /// Signals the container's init directly (through the OCI runtime for a sandbox-per-container
    /// handler, whose init is inside its sandbox); `all` signals every process of a container that
    /// shares the pod's PID namespace. Without a handler only the direct signal is possible.
    async fn signal(
        &self,
        record: &ContainerRecord,
        handler: Option<&RuntimeHandler>,
        signal: Signal,
        all: bool,
    ) -> Result<(), Error> {
        let shared_pid = self.shares_pid_namespace(record);
        let own_sandbox = handler.is_some_and(|h| h.isolation == Isolation::SandboxPerContainer);
        if let (Some(pid), false) = (record.pid, own_sandbox) {
            host::kill(pid, signal)
                .map_err(|e| Error::Host { what: format!("signalling container {}", record.id), source: e })?;
            if !(all && shared_pid) {
                return Ok(());
            }
        }
        let Some(runtime) = handler.map(|h| h.oci().clone()) else {
            return Err(self.unknown_handler(&record.handler));
        };
        let id = record.id.clone();
        let result = tokio::task::spawn_blocking(move || runtime.kill(&id, signal, all)).await.map_err(Error::Task)?;
        match result {
            // Already gone, or stopped between our check and the kill.
            Ok(()) | Err(OciError::NotFound { .. }) | Err(OciError::CommandFailed { .. }) => Ok(()),
            Err(e) => Err(Error::Oci { op: "kill", id: record.id.clone(), source: Box::new(e) }),
        }
    }

    fn shares_pid_namespace(&self, record: &ContainerRecord) -> bool {
        let config = record.container_config().unwrap_or_default();
        let pid_mode = config.linux.and_then(|l| l.security_context).and_then(|s| s.namespace_options).map(|n| n.pid);
        pid_mode == Some(cri::NamespaceMode::Pod as i32)
    }

    /// The image's `StopSignal`, SIGTERM when unset or unknown.
    fn stop_signal(&self, record: &ContainerRecord) -> Signal {
        let handler = record.handler.clone();
        let image = self.images.status(&record.image_id, &handler).ok().flatten();
        let name = image.as_ref().and_then(|i| i.config["config"]["StopSignal"].as_str()).unwrap_or("SIGTERM");
        parse_signal(name).unwrap_or(Signal::SIGTERM)
    }

    pub async fn remove_container(
        self: &Arc<Self>,
        req: cri::RemoveContainerRequest,
    ) -> Result<cri::RemoveContainerResponse, Error> {
        let id = match self.store.resolve::<ContainerRecord>(&req.container_id) {
            Ok(id) => id,
            // CRI: removing a container that is gone is not an error.
            Err(StateError::NotFound { .. }) => return Ok(cri::RemoveContainerResponse {}),
            Err(e) => return Err(e.into()),
        };
        let handler = self.handler(&self.store.container(&id)?.handler).ok();
        // A running container is force-removed: stopped at once first.
        self.stop_container_now(&id, handler.as_deref(), 0).await?;
        let claim = self.store.begin_remove_container(&id)?;
        let record = claim.record().clone();
        if handler.as_ref().is_some_and(|h| h.isolation == Isolation::SandboxPerContainer) {
            // `runsc delete` takes over a second after the app is gone: the record goes now and the
            // host side follows in the background. A crash in between leaves a record-less
            // directory, which the next start finishes removing (see `Cri::open`).
            self.blocking_state(move || claim.remove().map(drop)).await?;
            let cri = Arc::clone(self);
            let (id, handler, sandbox_id) = (id.clone(), handler.clone(), record.sandbox_id.clone());
            let sandbox_cgroup = self.store.sandbox(&sandbox_id).ok().and_then(|s| self.own_sandbox_cgroup(&s));
            self.background.spawn(async move {
                cri.cleanup_container_files(&id, handler.as_deref()).await;
                let _ = std::fs::remove_dir_all(cri.store.container_dir(&id));
                // The sandbox removed meanwhile could not remove its cgroup while this
                // container's was in it (see `remove_pod_sandbox`).
                if let Some(cgroup) = sandbox_cgroup
                    && cri.store.sandbox(&sandbox_id).is_err()
                {
                    host::remove_cgroup(&cgroup);
                }
            });
        } else {
            self.cleanup_container_files(&id, handler.as_deref()).await;
            self.blocking_state(move || claim.remove().map(drop)).await?;
        }
        self.exits.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        self.emit(&record, cri::ContainerEventType::ContainerDeletedEvent);
        tracing::info!(container = %id, "container removed");
        Ok(cri::RemoveContainerResponse {})
    }

    /// Deletes the OCI container (forced; not without its `handler`) and its cgroup, waits briefly
    /// for its monitor, unmounts the rootfs and removes everything in the container's directory
    /// but the record.
    async fn cleanup_container_files(&self, id: &str, handler: Option<&RuntimeHandler>) {
        let dir = self.store.container_dir(id);
        // Read before the bundle goes. The OCI runtime removes the cgroup when it deletes the
        // container, but runsc leaves it when its sandbox failed to start (the pod's stays busy).
        let cgroup = spec_cgroup(&dir.join("bundle"));
        let pending = self.oci_deletes.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
        let deleted = match pending {
            Some(mut rx) => {
                let done = tokio::time::timeout(Duration::from_secs(30), rx.wait_for(Option::is_some)).await;
                matches!(done, Ok(Ok(state)) if *state == Some(true))
            }
            None => false,
        };
        if !deleted && let Some(runtime) = handler.map(|h| h.oci().clone()) {
            let id_owned = id.to_string();
            match tokio::task::spawn_blocking(move || runtime.delete(&id_owned, true)).await {
                Ok(Ok(())) | Ok(Err(OciError::NotFound { .. })) => {}
                Ok(Err(e)) => tracing::warn!(container = %id, error = %e, "deleting the OCI container failed"),
                Err(e) => tracing::warn!(container = %id, error = %e, "deleting the OCI container failed"),
            }
        }
        if let Some(cgroup) = cgroup {
            host::remove_cgroup(&cgroup);
        }
        if let Ok(Some(monitor_pid)) = berth_monitor::read_monitor_pid(&monitor_dir(self.store.root(), id)) {
            let _ = tokio::time::timeout(Duration::from_secs(2), host::wait_for_exit(monitor_pid)).await;
        }
        if let Err(e) = host::unmount(&dir.join("bundle").join("rootfs")) {
            tracing::warn!(container = %id, error = %e, "unmounting the rootfs failed");
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let path = entry.path();
                if path.file_name().is_some_and(|n| n == "container.json") {
                    continue;
                }
                let removed = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
                if let Err(e) = removed {
                    tracing::warn!(path = %path.display(), error = %e, "removing container files failed");
                }
            }
        }
    }

    pub fn list_containers(&self, req: cri::ListContainersRequest) -> cri::ListContainersResponse {
        let filter = req.filter.map(ContainerFilter::from).unwrap_or_default();
        let containers = self.store.list_containers(&filter).iter().map(ContainerRecord::to_cri).collect();
        cri::ListContainersResponse { containers }
    }

    pub fn container_status(&self, req: cri::ContainerStatusRequest) -> Result<cri::ContainerStatusResponse, Error> {
        let record = self.store.container(&req.container_id)?;
        let info = if req.verbose { self.container_info(&record) } else { HashMap::new() };
        Ok(cri::ContainerStatusResponse { status: Some(self.container_status_of(&record)), info })
    }

    /// The CRI status with the log path, mounts and resources from the stored config.
    pub(crate) fn container_status_of(&self, record: &ContainerRecord) -> cri::ContainerStatus {
        let mut status = record.to_cri_status();
        status.log_path = record.log_path.clone();
        let config = record.container_config().unwrap_or_default();
        if let Some(r) = config.linux.and_then(|l| l.resources) {
            status.resources = Some(cri::ContainerResources { linux: Some(r), windows: None });
        }
        status
    }

    fn container_info(&self, record: &ContainerRecord) -> HashMap<String, String> {
        let spec: serde_json::Value = std::fs::read(record.bundle.join("config.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(serde_json::Value::Null);
        let info = json!({
            "sandboxID": record.sandbox_id,
            "pid": record.pid.unwrap_or(0),
            "monitorPid": record.monitor_pid.unwrap_or(0),
            "runtimeHandler": record.handler,
            "bundle": record.bundle,
            "config": record.config,
            "runtimeSpec": spec,
        });
        HashMap::from([("info".to_string(), info.to_string())])
    }

    pub async fn update_container_resources(
        &self,
        req: cri::UpdateContainerResourcesRequest,
    ) -> Result<cri::UpdateContainerResourcesResponse, Error> {
        let record = self.store.container(&req.container_id)?;
        if !matches!(record.state(), ContainerState::Created | ContainerState::Running) {
            return Err(Error::FailedPrecondition(format!(
                "container {} is {}: only a created or running container can be updated",
                record.id,
                record.state().as_str()
            )));
        }
        let Some(linux) = req.linux else { return Ok(cri::UpdateContainerResourcesResponse {}) };
        let oci = oci_spec_gen::linux_resources(&resources(&linux))
            .map_err(|e| Error::InvalidArgument(format!("resources of container {}: {e}", record.id)))?;
        let file = self.store.container_dir(&record.id).join("resources.json");
        std::fs::write(&file, serde_json::to_vec(&oci).expect("resources serialize"))
            .map_err(|e| Error::Host { what: "writing resources.json".into(), source: e })?;
        if record.state() == ContainerState::Created && record.monitor_pid.is_none() {
            // No OCI container yet (StartContainer makes it): the bundle's spec takes the values.
            update_spec_resources(&record.bundle.join("config.json"), &oci).map_err(|e| Error::Host {
                what: format!("updating config.json of container {}", record.id),
                source: e,
            })?;
        } else {
            let runtime = self.handler(&record.handler)?.oci().clone();
            let id = record.id.clone();
            let result = tokio::task::spawn_blocking(move || runtime.update(&id, &file)).await.map_err(Error::Task)?;
            result.map_err(|e| Error::Oci { op: "update", id: record.id.clone(), source: Box::new(e) })?;
        }
        // Kept in the stored config, so that ContainerStatus reports the new values.
        let stored = serde_json::to_value(&linux).expect("CRI resources serialize");
        let store = self.store.clone();
        let id = record.id.clone();
        let updated = self
            .blocking_state(move || {
                store.update_container(&id, |c| {
                    if let Some(cfg) = c.config.as_object_mut() {
                        let linux = cfg.entry("linux").or_insert_with(|| json!({}));
                        if linux.is_null() {
                            *linux = json!({});
                        }
                        if let Some(l) = linux.as_object_mut() {
                            l.insert("resources".into(), stored);
                        }
                    }
                    Ok(())
                })
            })
            .await;
        match updated {
            Ok(_) | Err(StateError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(cri::UpdateContainerResourcesResponse {})
    }

    pub fn reopen_container_log(
        &self,
        req: cri::ReopenContainerLogRequest,
    ) -> Result<cri::ReopenContainerLogResponse, Error> {
        let record = self.running(&req.container_id)?;
        let pid = record
            .monitor_pid
            .ok_or_else(|| Error::FailedPrecondition(format!("container {} has no monitor", record.id)))?;
        berth_monitor::reopen_log(pid).map_err(|e| Error::Host {
            what: format!("reopening the log of container {}", record.id),
            source: std::io::Error::other(e.to_string()),
        })?;
        // The monitor reopens on a signal; CRI callers expect the new file once this returns.
        let log = Path::new(&record.log_path);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !record.log_path.is_empty() && !log.exists() {
            if std::time::Instant::now() > deadline {
                return Err(Error::Timeout(format!(
                    "container {} did not reopen its log {}",
                    record.id, record.log_path
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(cri::ReopenContainerLogResponse {})
    }

    pub async fn exec_sync(&self, req: cri::ExecSyncRequest) -> Result<cri::ExecSyncResponse, Error> {
        if req.cmd.is_empty() {
            return Err(Error::InvalidArgument("ExecSync: cmd is required".into()));
        }
        let record = self.running(&req.container_id)?;
        let (process_file, pid_file) = self.exec_process_file(&record, &req.cmd, false, None)?;
        let runtime = self.handler(&record.handler)?;
        // In a sandbox the process's own pid is the sandbox's, in a file of its own.
        let in_sandbox = runtime.isolation == Isolation::SandboxPerContainer;
        let sandbox_pid_file = in_sandbox.then(|| pid_file.with_extension("sandbox-pid"));
        let mut options = ExecOptions::new(&process_file).pid_file(&pid_file);
        if let Some(file) = &sandbox_pid_file {
            options = options.internal_pid_file(file);
        }
        let args = runtime.oci().exec_args(&record.id, &options);
        let remove_files = || {
            for file in [Some(&process_file), Some(&pid_file), sandbox_pid_file.as_ref()].into_iter().flatten() {
                let _ = std::fs::remove_file(file);
            }
        };
        let mut command = tokio::process::Command::new(&args[0]);
        command
            .args(&args[1..])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|e| Error::Host { what: "starting the exec".into(), source: e })?;
        let (out_task, err_task) = (read_all(child.stdout.take()), read_all(child.stderr.take()));
        let status = if req.timeout > 0 {
            tokio::time::timeout(Duration::from_secs(req.timeout as u64), child.wait()).await
        } else {
            Ok(child.wait().await)
        };
        let status = match status {
            Ok(status) => status.map_err(|e| Error::Host { what: "running the exec".into(), source: e })?,
            Err(_) => {
                let read = |file: &Path| std::fs::read_to_string(file).ok();
                let victim =
                    timed_out_exec(runtime.isolation, read(&pid_file), sandbox_pid_file.as_deref().and_then(read));
                kill_exec(&record.id, &runtime, victim).await;
                // The runtime exits once its process is gone; dropping it kills it otherwise.
                let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
                remove_files();
                return Err(Error::Timeout(format!(
                    "command {:?} in container {} timed out after {}s",
                    req.cmd, record.id, req.timeout
                )));
            }
        };
        remove_files();
        let output = std::process::Output {
            status,
            stdout: out_task.await.unwrap_or_default(),
            stderr: err_task.await.unwrap_or_default(),
        };
        let mut stdout = output.stdout;
        let mut stderr = output.stderr;
        stdout.truncate(MAX_EXEC_OUTPUT);
        stderr.truncate(MAX_EXEC_OUTPUT);
        Ok(cri::ExecSyncResponse { stdout, stderr, exit_code: output.status.code().unwrap_or(-1) })
    }

    /// Writes the exec's OCI `process` (the container's, with `cmd` as args) to a fresh file in the
    /// container's directory; returns it and the pid file the runtime should write.
    pub(crate) fn exec_process_file(
        &self,
        record: &ContainerRecord,
        cmd: &[String],
        tty: bool,
        console_size: Option<TerminalSize>,
    ) -> Result<(PathBuf, PathBuf), Error> {
        let host_err = |what: &'static str| move |e| Error::Host { what: what.into(), source: e };
        let spec: serde_json::Value = std::fs::read(record.bundle.join("config.json"))
            .map_err(host_err("reading the container's config.json"))
            .and_then(|b| {
                serde_json::from_slice(&b)
                    .map_err(|e| Error::Host { what: "parsing config.json".into(), source: std::io::Error::other(e) })
            })?;
        let process = exec_process(spec["process"].clone(), cmd, tty, console_size);
        let name = uuid::Uuid::new_v4().simple().to_string();
        let dir = self.store.container_dir(&record.id);
        let process_file = dir.join(format!("exec-{name}.json"));
        std::fs::write(&process_file, process.to_string()).map_err(host_err("writing the exec process"))?;
        Ok((process_file, dir.join(format!("exec-{name}.pid"))))
    }

    /// Sends a container event to every GetContainerEvents subscriber.
    pub(crate) fn emit(&self, record: &ContainerRecord, kind: cri::ContainerEventType) {
        tracing::debug!(container = %record.id, event = ?kind, subscribers = self.events.receiver_count(), "container event");
        if self.events.receiver_count() == 0 {
            return;
        }
        let sandbox = self.store.sandbox(&record.sandbox_id).ok().map(|s| s.to_cri_status());
        let _ = self.events.send(cri::ContainerEventResponse {
            container_id: record.id.clone(),
            container_event_type: kind as i32,
            created_at: now_ns(),
            pod_sandbox_status: sandbox,
            containers_statuses: vec![self.container_status_of(record)],
        });
    }
}

/// Where a container's monitor listens for attach clients: short, as socket paths must be.
/// Sets the fields of `resources` (an OCI `LinuxResources`, as `runc update --resources` takes it)
/// in a bundle's `config.json`, keeping the others.
fn update_spec_resources<T: serde::Serialize>(config: &Path, resources: &T) -> std::io::Result<()> {
    let mut spec: serde_json::Value = serde_json::from_slice(&std::fs::read(config)?)?;
    let update = serde_json::to_value(resources).map_err(std::io::Error::other)?;
    let linux = spec.as_object_mut().ok_or_else(|| std::io::Error::other("config.json is not an object"))?;
    let linux = linux.entry("linux").or_insert_with(|| json!({}));
    let current = linux
        .as_object_mut()
        .ok_or_else(|| std::io::Error::other("config.json linux is not an object"))?
        .entry("resources")
        .or_insert_with(|| json!({}));
    if let (Some(current), Some(update)) = (current.as_object_mut(), update.as_object()) {
        for (key, value) in update {
            match (current.get_mut(key).and_then(|v| v.as_object_mut()), value.as_object()) {
                (Some(inner), Some(fields)) => inner.extend(fields.iter().map(|(k, v)| (k.clone(), v.clone()))),
                _ => {
                    current.insert(key.clone(), value.clone());
                }
            }
        }
    }
    std::fs::write(config, serde_json::to_vec_pretty(&spec)?)
}

pub(crate) fn attach_socket(id: &str) -> PathBuf {
    Path::new(ATTACH_DIR).join(format!("{id}.sock"))
}

/// Where the OCI runtime sends the terminal of container `id` to its monitor (short: `sun_path`).
fn console_socket(id: &str) -> PathBuf {
    Path::new(ATTACH_DIR).join(format!("{id}.console"))
}

/// The directory of the monitors' attach sockets.
const ATTACH_DIR: &str = "/run/berth/attach";

/// Reads a child's pipe to its end in a task of its own.
fn read_all(pipe: Option<impl tokio::io::AsyncRead + Unpin + Send + 'static>) -> tokio::task::JoinHandle<Vec<u8>> {
    tokio::spawn(async move {
        let mut buf = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut pipe, &mut buf).await;
        }
        buf
    })
}

/// CRI resources in the spec generator's form.
fn resources(r: &cri::LinuxContainerResources) -> oci_spec_gen::Resources {
    oci_spec_gen::Resources {
        cpu_period: r.cpu_period,
        cpu_quota: r.cpu_quota,
        cpu_shares: r.cpu_shares,
        memory_limit_in_bytes: r.memory_limit_in_bytes,
        memory_swap_limit_in_bytes: r.memory_swap_limit_in_bytes,
        oom_score_adj: r.oom_score_adj,
        cpuset_cpus: r.cpuset_cpus.clone(),
        cpuset_mems: r.cpuset_mems.clone(),
        hugepage_limits: r.hugepage_limits.iter().map(|h| (h.page_size.clone(), h.limit)).collect(),
        unified: r.unified.clone().into_iter().collect(),
    }
}

/// The seccomp profile a security context asks for: the `seccomp` field, else the deprecated
/// `seccomp_profile_path`; unset means unconfined (CRI's rule).
// The deprecated field is still what older kubelets and crictl configs send.
#[allow(deprecated)]
fn seccomp_profile(sc: &cri::LinuxContainerSecurityContext) -> Result<oci_spec_gen::SeccompProfile, String> {
    use oci_spec_gen::SeccompProfile;
    let localhost = |path: &str| -> Result<SeccompProfile, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("reading seccomp profile {path:?}: {e}"))?;
        let profile = serde_json::from_str(&text).map_err(|e| format!("seccomp profile {path:?} is not valid: {e}"))?;
        Ok(SeccompProfile::Custom(profile))
    };
    if let Some(p) = &sc.seccomp {
        return match cri::security_profile::ProfileType::try_from(p.profile_type) {
            Ok(cri::security_profile::ProfileType::RuntimeDefault) => Ok(SeccompProfile::RuntimeDefault),
            Ok(cri::security_profile::ProfileType::Unconfined) => Ok(SeccompProfile::Unconfined),
            Ok(cri::security_profile::ProfileType::Localhost) => localhost(&p.localhost_ref),
            Err(_) => Err(format!("unknown seccomp profile type {}", p.profile_type)),
        };
    }
    match sc.seccomp_profile_path.as_str() {
        "" | "unconfined" => Ok(SeccompProfile::Unconfined),
        "runtime/default" | "docker/default" => Ok(SeccompProfile::RuntimeDefault),
        path => match path.strip_prefix("localhost/") {
            Some(file) => localhost(file),
            None => Err(format!("unknown seccomp profile {path:?}")),
        },
    }
}

/// `SIGTERM`, `TERM`, `15` → the signal.
fn parse_signal(name: &str) -> Option<Signal> {
    if let Ok(n) = name.parse::<i32>() {
        return Signal::try_from(n).ok();
    }
    let upper = name.to_ascii_uppercase();
    let full = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
    full.parse().ok()
}

/// The process of an exec that ExecSync kills when it times out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExecProcess {
    /// runc, crun: the process on the host, killed by its pid. Killed before the OCI runtime's
    /// exec, which then reaps it and exits; killing the runtime first would leave the process to
    /// the container's init, which may never reap it.
    Host(i32),
    /// runsc: the process inside the sandbox, killed through `runsc kill --pid` with the pid the
    /// sandbox gave it. The host pid runsc writes is its `runsc exec` client's, and killing that
    /// leaves the process running in the sandbox.
    InSandbox(u32),
    /// Its pid is not written yet: there is only the OCI runtime's exec to kill.
    NotStarted,
}

/// Kills the process of a timed-out exec where it runs (see [`ExecProcess`]).
async fn kill_exec(id: &str, runtime: &RuntimeHandler, victim: ExecProcess) {
    match victim {
        ExecProcess::Host(pid) => {
            let _ = host::kill(pid, Signal::SIGKILL);
        }
        ExecProcess::InSandbox(pid) => {
            let oci = runtime.oci().clone();
            let container = id.to_owned();
            let killed = tokio::task::spawn_blocking(move || oci.kill_process(&container, pid, Signal::SIGKILL)).await;
            if let Ok(Err(e)) = killed {
                tracing::warn!(container = %id, pid, error = %e, "killing a timed-out exec in the sandbox failed");
            }
        }
        ExecProcess::NotStarted => {}
    }
}

/// Which process a timed-out exec is, from the texts of the pid files the runtime wrote: the host
/// pid file and, in a sandbox, the sandbox's one.
fn timed_out_exec(isolation: Isolation, host_pid: Option<String>, sandbox_pid: Option<String>) -> ExecProcess {
    let parse = |text: Option<String>| text.and_then(|t| t.trim().parse::<i64>().ok()).filter(|pid| *pid > 0);
    let found = match isolation {
        Isolation::SharedPodNamespaces => parse(host_pid).and_then(|p| i32::try_from(p).ok()).map(ExecProcess::Host),
        Isolation::SandboxPerContainer => {
            parse(sandbox_pid).and_then(|p| u32::try_from(p).ok()).map(ExecProcess::InSandbox)
        }
    };
    found.unwrap_or(ExecProcess::NotStarted)
}

/// The OCI process of an exec of `cmd`, from the container's own `process`. With a terminal,
/// `console_size` is the size the OCI runtime gives it before the command runs (runc copies the
/// size of our side only after the start, so a command asking at once would see 0×0).
fn exec_process(
    mut process: serde_json::Value,
    cmd: &[String],
    tty: bool,
    console_size: Option<TerminalSize>,
) -> serde_json::Value {
    process["args"] = json!(cmd);
    process["terminal"] = json!(tty);
    if tty {
        // As containerd: TERM=xterm in a terminal exec, replacing the container's.
        let mut env: Vec<serde_json::Value> = process["env"].as_array().cloned().unwrap_or_default();
        env.retain(|e| !e.as_str().is_some_and(|e| e.starts_with("TERM=")));
        env.push(json!("TERM=xterm"));
        process["env"] = json!(env);
        if let Some(size) = console_size {
            process["consoleSize"] = json!({"height": size.height, "width": size.width});
        }
    }
    process
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_terminal_size_becomes_the_process_specs_console_size_keeping_the_rest() {
        let container = json!({"terminal": false, "args": ["nginx"], "cwd": "/srv"});
        let size = TerminalSize { width: 132, height: 43 };
        let process = exec_process(container, &["sh".to_string()], true, Some(size));
        assert_eq!(
            process,
            json!({"terminal": true, "args": ["sh"], "cwd": "/srv", "env": ["TERM=xterm"], "consoleSize": {"height": 43, "width": 132}})
        );
    }

    #[test]
    fn resources_of_a_created_container_are_merged_into_its_bundle_spec() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.json");
        let spec = json!({"process": {"args": ["sh"]}, "linux": {"resources": {"memory": {"limit": 1}, "pids": {"limit": 5}}}});
        std::fs::write(&config, spec.to_string()).unwrap();
        update_spec_resources(&config, &json!({"memory": {"limit": 4096, "swap": 8192}, "cpu": {"shares": 256}}))
            .unwrap();
        let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
        assert_eq!(
            spec["linux"]["resources"],
            json!({"memory": {"limit": 4096, "swap": 8192}, "pids": {"limit": 5}, "cpu": {"shares": 256}})
        );
        assert_eq!(spec["process"]["args"], json!(["sh"]), "the rest of the spec is kept");
    }

    #[test]
    fn a_timed_out_exec_under_runc_is_killed_by_its_host_pid() {
        let text = |s: &str| Some(s.to_string());
        assert_eq!(timed_out_exec(Isolation::SharedPodNamespaces, text("4242\n"), None), ExecProcess::Host(4242));
        assert_eq!(timed_out_exec(Isolation::SharedPodNamespaces, text("4242"), text("2")), ExecProcess::Host(4242));
    }

    #[test]
    fn a_timed_out_exec_under_runsc_is_killed_by_its_pid_in_the_sandbox_not_by_the_clients() {
        let text = |s: &str| Some(s.to_string());
        let victim = timed_out_exec(Isolation::SandboxPerContainer, text("12294"), text("2"));
        assert_eq!(victim, ExecProcess::InSandbox(2));
        assert_eq!(timed_out_exec(Isolation::SandboxPerContainer, text("12294"), None), ExecProcess::NotStarted);
    }

    #[test]
    fn an_exec_whose_pid_is_missing_or_not_a_pid_leaves_only_the_runtime_to_kill() {
        for bad in [None, Some(String::new()), Some("0".into()), Some("-1".into()), Some("x".into())] {
            assert_eq!(timed_out_exec(Isolation::SharedPodNamespaces, bad.clone(), None), ExecProcess::NotStarted);
            assert_eq!(timed_out_exec(Isolation::SandboxPerContainer, None, bad), ExecProcess::NotStarted);
        }
    }

    #[test]
    fn stop_signals_parse_by_name_short_name_and_number() {
        assert_eq!(parse_signal("SIGQUIT"), Some(Signal::SIGQUIT));
        assert_eq!(parse_signal("int"), Some(Signal::SIGINT));
        assert_eq!(parse_signal("9"), Some(Signal::SIGKILL));
        assert_eq!(parse_signal("SIGBOGUS"), None);
    }

    #[test]
    #[allow(deprecated)]
    fn seccomp_defaults_to_unconfined_and_honours_the_deprecated_path() {
        let mut sc = cri::LinuxContainerSecurityContext::default();
        assert_eq!(seccomp_profile(&sc), Ok(oci_spec_gen::SeccompProfile::Unconfined));
        sc.seccomp_profile_path = "runtime/default".into();
        assert_eq!(seccomp_profile(&sc), Ok(oci_spec_gen::SeccompProfile::RuntimeDefault));
        sc.seccomp = Some(cri::SecurityProfile { profile_type: 1, localhost_ref: String::new() });
        assert_eq!(seccomp_profile(&sc), Ok(oci_spec_gen::SeccompProfile::Unconfined));
        sc.seccomp = Some(cri::SecurityProfile { profile_type: 2, localhost_ref: "/nonexistent.json".into() });
        assert!(seccomp_profile(&sc).unwrap_err().contains("/nonexistent.json"));
    }
}
