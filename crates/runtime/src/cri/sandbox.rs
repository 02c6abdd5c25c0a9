//! CRI pod sandbox verbs: RunPodSandbox, StopPodSandbox, RemovePodSandbox, PodSandboxStatus and
//! ListPodSandbox.
//!
//! A sandbox is, on the host:
//! - a network namespace under the netns dir, wired by the CNI plugins (none with host networking);
//! - for handlers that share the pod's namespaces (runc, crun), an infra process
//!   (`unshare … berth-monitor pause`) holding the pod's shared IPC and UTS namespaces (and its PID
//!   namespace when the pod shares one) — no infra container: containers join
//!   `/proc/<infra>/ns/…`. A sandbox-per-container handler (gVisor's runsc) runs each container as
//!   its own sandbox in the pod's netns, so it gets no infra process;
//! - files in the record's directory that every container mounts: `hostname`, `resolv.conf`,
//!   `hosts`, and a `shm` tmpfs when the pod has its own IPC namespace.
//!
//! Stop tears all of that down and is idempotent; remove stops first, so networking is torn down
//! once, by whichever comes first (the record forgets the netns once it is gone).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use berth_cni::{Attachment, PortMapping};
use k8s_cri::v1 as cri;
use nix::sys::signal::Signal;
use serde_json::json;

use super::{Cri, Error};
use crate::config::{Isolation, RuntimeHandler};
use crate::host;
use crate::state::{SandboxFilter, SandboxRecord, now_ns};

/// Size of a pod's `/dev/shm`, as containerd and Docker default it.
const SHM_OPTIONS: &str = "mode=1777,size=65536k";

impl Cri {
    pub async fn run_pod_sandbox(
        self: &Arc<Self>,
        req: cri::RunPodSandboxRequest,
    ) -> Result<cri::RunPodSandboxResponse, Error> {
        let config = req.config.ok_or_else(|| Error::InvalidArgument("RunPodSandbox: config is required".into()))?;
        let handler = self.handler(&req.runtime_handler)?;
        let privileged = config.linux.as_ref().and_then(|l| l.security_context.as_ref()).is_some_and(|s| s.privileged);
        if privileged && !handler.privileged {
            return Err(Error::InvalidArgument(format!(
                "runtime handler {:?} does not allow privileged pods (set privileged = true in its config)",
                handler.name
            )));
        }
        let record = SandboxRecord::new(&config, &handler.name, now_ns())?;
        let store = self.store.clone();
        let mut claim = self.blocking_state(move || store.create_sandbox(record)).await?;
        let id = claim.id().to_string();
        match self.setup_sandbox(&mut claim, &config, &handler).await {
            Ok(()) => {
                self.blocking_state(move || claim.commit(|s| s.mark_ready())).await?;
                tracing::info!(sandbox = %id, handler = %handler.name, "pod sandbox ready");
                Ok(cri::RunPodSandboxResponse { pod_sandbox_id: id })
            }
            Err(e) => {
                let record = claim.record().clone();
                if let Err(undo) = self.teardown_sandbox(&record).await {
                    tracing::warn!(sandbox = %id, error = %undo, "cleaning up a failed sandbox");
                }
                let _ = std::fs::remove_dir_all(self.sandbox_files_dir(&id));
                self.blocking_state(move || claim.remove().map(drop)).await?;
                Err(e)
            }
        }
    }

    /// Files, infra process, network; each piece recorded as soon as it exists, so that a crash
    /// leaves it to be cleaned up by stop and remove.
    async fn setup_sandbox(
        &self,
        claim: &mut crate::state::SandboxClaim,
        config: &cri::PodSandboxConfig,
        handler: &RuntimeHandler,
    ) -> Result<(), Error> {
        let record = claim.record().clone();
        let files = self.sandbox_files_dir(&record.id);
        let host_network = record.namespaces.host_network();
        let host_ipc = record.namespaces.ipc == cri::NamespaceMode::Node as i32;
        write_sandbox_files(&files, config, host_network)
            .map_err(|e| Error::Host { what: format!("writing the files of sandbox {}", record.id), source: e })?;
        if !host_ipc && handler.isolation == Isolation::SharedPodNamespaces {
            host::mount_tmpfs(&files.join("shm"), SHM_OPTIONS)
                .map_err(|e| Error::Host { what: format!("sandbox {} /dev/shm", record.id), source: e })?;
        }

        let infra = infra_options(&record, config, handler);
        let network = async {
            if host_network {
                return Ok(None);
            }
            let attachment = self.attachment(&record, config, PathBuf::new());
            let cni = self.cni.clone();
            let netns = self.netns.clone();
            let network = tokio::task::spawn_blocking(move || cni.setup_sandbox(netns.as_ref(), attachment))
                .await
                .map_err(Error::Task)?
                .map_err(|e| Error::Network { sandbox: record.id.clone(), source: Box::new(e) })?;
            Ok::<_, Error>(Some(network))
        };
        let infra_process = async {
            if !infra.needed() {
                return Ok(None);
            }
            host::spawn_infra(&self.monitor_binary, &infra)
                .await
                .map(Some)
                .map_err(|e| Error::Host { what: format!("the infra process of sandbox {}", record.id), source: e })
        };
        // The CNI plugins dominate; the infra process starts meanwhile.
        let (network, infra_pid) = tokio::join!(network, infra_process);
        let (network, infra_pid) = match (network, infra_pid) {
            (Ok(n), Ok(p)) => (n, p),
            (n, p) => {
                // Record whatever did get set up, so that the caller's teardown finds it.
                let netns = n.as_ref().ok().and_then(|n| n.as_ref().map(|n| n.netns_path.clone()));
                let pid = p.as_ref().ok().copied().flatten();
                let _ = claim.update(|s| {
                    s.netns_path = netns;
                    s.infra_pid = pid;
                    Ok(())
                });
                return Err(n.err().or(p.err()).expect("one of them failed"));
            }
        };
        claim.update(|s| {
            if let Some(n) = &network {
                s.netns_path = Some(n.netns_path.clone());
                s.ips = n.result.ips.iter().map(|ip| ip.address.to_string()).collect();
            }
            s.infra_pid = infra_pid;
            Ok(())
        })?;
        Ok(())
    }

    fn attachment(&self, record: &SandboxRecord, config: &cri::PodSandboxConfig, netns: PathBuf) -> Attachment {
        let m = &record.metadata;
        let ports = config
            .port_mappings
            .iter()
            .filter(|p| p.host_port > 0)
            .map(|p| PortMapping {
                host_port: p.host_port as u16,
                container_port: p.container_port as u16,
                protocol: match cri::Protocol::try_from(p.protocol) {
                    Ok(cri::Protocol::Udp) => "udp".into(),
                    Ok(cri::Protocol::Sctp) => "sctp".into(),
                    _ => "tcp".into(),
                },
                host_ip: (!p.host_ip.is_empty()).then(|| p.host_ip.clone()),
            })
            .collect();
        Attachment::new(record.id.clone(), netns).with_pod(&m.namespace, &m.name, &m.uid).with_port_mappings(ports)
    }

    /// Stops the sandbox's containers (SIGKILL), its infra process, its network and its shm, each
    /// step idempotent, recording each piece as gone once it is.
    async fn teardown_sandbox(self: &Arc<Self>, record: &SandboxRecord) -> Result<(), Error> {
        let handler = self.handler(&record.runtime_handler).ok();
        for c in self.store.containers_in(&record.id) {
            if c.state().can_stop() {
                self.stop_container_now(&c.id, handler.as_deref(), 0).await?;
            }
        }
        if let Some(pid) = record.infra_pid {
            host::kill(pid, Signal::SIGKILL)
                .map_err(|e| Error::Host { what: format!("killing infra process {pid}"), source: e })?;
        }
        if let Some(netns) = &record.netns_path {
            let config = record.pod_config().unwrap_or_default();
            let attachment = self.attachment(record, &config, netns.clone());
            let cni = self.cni.clone();
            let ns = self.netns.clone();
            tokio::task::spawn_blocking(move || cni.teardown_sandbox(ns.as_ref(), &attachment))
                .await
                .map_err(Error::Task)?
                .map_err(|e| Error::Network { sandbox: record.id.clone(), source: Box::new(e) })?;
        }
        let shm = self.sandbox_files_dir(&record.id).join("shm");
        host::unmount(&shm).map_err(|e| Error::Host { what: "unmounting the pod's /dev/shm".into(), source: e })?;
        Ok(())
    }

    pub async fn stop_pod_sandbox(
        self: &Arc<Self>,
        req: cri::StopPodSandboxRequest,
    ) -> Result<cri::StopPodSandboxResponse, Error> {
        let store = self.store.clone();
        let id = req.pod_sandbox_id.clone();
        // CRI: stopping a sandbox that is gone is not an error.
        let claim = match store.begin_stop_sandbox(&id) {
            Ok(claim) => claim,
            Err(crate::state::StateError::NotFound { .. }) => return Ok(cri::StopPodSandboxResponse {}),
            Err(e) => return Err(e.into()),
        };
        let record = claim.record().clone();
        self.teardown_sandbox(&record).await?;
        let sandbox_id = record.id.clone();
        self.blocking_state(move || {
            claim.commit(|s| {
                s.netns_path = None;
                s.infra_pid = None;
                Ok(s.stop())
            })
        })
        .await?;
        tracing::info!(sandbox = %sandbox_id, "pod sandbox stopped");
        Ok(cri::StopPodSandboxResponse {})
    }

    pub async fn remove_pod_sandbox(
        self: &Arc<Self>,
        req: cri::RemovePodSandboxRequest,
    ) -> Result<cri::RemovePodSandboxResponse, Error> {
        let id = match self.store.resolve::<SandboxRecord>(&req.pod_sandbox_id) {
            Ok(id) => id,
            // CRI: removing a sandbox that is gone is not an error.
            Err(crate::state::StateError::NotFound { .. }) => return Ok(cri::RemovePodSandboxResponse {}),
            Err(e) => return Err(e.into()),
        };
        self.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: id.clone() }).await?;
        for c in self.store.containers_in(&id) {
            self.remove_container(cri::RemoveContainerRequest { container_id: c.id.clone() }).await?;
        }
        let store = self.store.clone();
        let claim = store.begin_remove_sandbox(&id)?;
        let own_cgroup = self.own_sandbox_cgroup(claim.record());
        // The stop above unmounted the pod's /dev/shm.
        let _ = std::fs::remove_dir_all(self.sandbox_files_dir(&id));
        self.blocking_state(move || claim.remove().map(drop)).await?;
        // After the record: a container still being deleted in the background (gVisor) keeps the
        // cgroup busy, and removes it itself once it finds the sandbox gone.
        if let Some(cgroup) = own_cgroup {
            host::remove_cgroup(&cgroup);
        }
        tracing::info!(sandbox = %id, "pod sandbox removed");
        Ok(cri::RemovePodSandboxResponse {})
    }

    pub fn pod_sandbox_status(
        &self,
        req: cri::PodSandboxStatusRequest,
    ) -> Result<cri::PodSandboxStatusResponse, Error> {
        let record = self.store.sandbox(&req.pod_sandbox_id)?;
        let info = if req.verbose { self.sandbox_info(&record) } else { HashMap::new() };
        let containers_statuses =
            self.store.containers_in(&record.id).iter().map(|c| self.container_status_of(c)).collect();
        Ok(cri::PodSandboxStatusResponse {
            status: Some(record.to_cri_status()),
            info,
            containers_statuses,
            timestamp: now_ns(),
        })
    }

    fn sandbox_info(&self, record: &SandboxRecord) -> HashMap<String, String> {
        let info = json!({
            "pid": record.infra_pid.unwrap_or(0),
            "netns": record.netns_path,
            "runtimeHandler": record.runtime_handler,
            "processStatus": record.state().as_str(),
            "files": self.sandbox_files_dir(&record.id),
            "config": record.config,
        });
        HashMap::from([("info".to_string(), info.to_string())])
    }

    pub fn list_pod_sandbox(&self, req: cri::ListPodSandboxRequest) -> cri::ListPodSandboxResponse {
        let filter = req.filter.map(SandboxFilter::from).unwrap_or_default();
        let items = self.store.list_sandboxes(&filter).iter().map(SandboxRecord::to_cri).collect();
        cri::ListPodSandboxResponse { items }
    }

    /// Where a sandbox keeps the files its containers mount.
    pub(crate) fn sandbox_files_dir(&self, id: &str) -> PathBuf {
        self.store.sandbox_dir(id).join("files")
    }
}

/// The namespaces the pod's infra process holds: shared PID only in `POD` mode, IPC unless the
/// host's, UTS unless the pod uses the host network (and hence the host's UTS, as in Kubernetes).
/// None for a sandbox-per-container handler.
fn infra_options(
    record: &SandboxRecord,
    config: &cri::PodSandboxConfig,
    handler: &RuntimeHandler,
) -> host::InfraOptions {
    if handler.isolation == Isolation::SandboxPerContainer {
        return host::InfraOptions::default();
    }
    let ns = &record.namespaces;
    let pod = cri::NamespaceMode::Pod as i32;
    let uts = !ns.host_network();
    host::InfraOptions {
        pid: ns.pid == pod,
        ipc: ns.ipc != cri::NamespaceMode::Node as i32,
        uts,
        hostname: uts.then(|| config.hostname.clone()).filter(|h| !h.is_empty()),
    }
}

/// `hostname`, `resolv.conf` (from the DNS config, else the host's) and `hosts` (the host's).
fn write_sandbox_files(dir: &Path, config: &cri::PodSandboxConfig, host_network: bool) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let hostname = if config.hostname.is_empty() || host_network {
        nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default()
    } else {
        config.hostname.clone()
    };
    std::fs::write(dir.join("hostname"), format!("{hostname}\n"))?;
    let resolv = match &config.dns_config {
        Some(dns) if !(dns.servers.is_empty() && dns.searches.is_empty() && dns.options.is_empty()) => resolv_conf(dns),
        _ => std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default(),
    };
    std::fs::write(dir.join("resolv.conf"), resolv)?;
    let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_else(|_| "127.0.0.1\tlocalhost\n".into());
    std::fs::write(dir.join("hosts"), hosts)?;
    Ok(())
}

/// A resolv.conf as kubelet's DNS config asks for it.
pub(crate) fn resolv_conf(dns: &cri::DnsConfig) -> String {
    let mut out = String::new();
    if !dns.searches.is_empty() {
        out.push_str(&format!("search {}\n", dns.searches.join(" ")));
    }
    for server in &dns.servers {
        out.push_str(&format!("nameserver {server}\n"));
    }
    if !dns.options.is_empty() {
        out.push_str(&format!("options {}\n", dns.options.join(" ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_lists_search_servers_and_options_in_that_order() {
        let dns = cri::DnsConfig {
            servers: vec!["10.0.0.10".into(), "8.8.8.8".into()],
            searches: vec!["default.svc.cluster.local".into(), "svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        };
        assert_eq!(
            resolv_conf(&dns),
            "search default.svc.cluster.local svc.cluster.local\nnameserver 10.0.0.10\nnameserver 8.8.8.8\noptions ndots:5\n"
        );
    }
}
