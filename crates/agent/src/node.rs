//! This node's Node object: registration, Lease heartbeats and status (conditions, runtime handlers).
//!
//! The Node is created (or an existing one adopted) with kubelet's default labels and a full
//! status; then a Lease in `kube-node-lease` is renewed every [`LEASE_RENEW_INTERVAL`], and the
//! status is patched whenever it changed — runtime readiness and handlers are followed as they
//! change — and at least every [`STATUS_REPORT_INTERVAL`]. Conditions' `lastTransitionTime` moves
//! only when their status flips.
//!
//! The patch is a strategic merge patch on `nodes/<name>/status`, as kubelet sends: conditions
//! merge by type, so conditions other parts set (anything but `Ready`, the pressures and this
//! agent's `RuntimeReady.berth.dev/*`) are never written back, even when they changed after the
//! agent last saw the Node; a runtime condition of an endpoint that is no longer configured
//! leaves with a `$patch: delete` element (a merge by type alone never removes one). See
//! [`status_patch`].

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Event, EventSource, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeRuntimeHandler,
    NodeRuntimeHandlerFeatures, NodeStatus, NodeSystemInfo, ObjectReference,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::agent::Context;
use crate::endpoint::Endpoint;
use crate::runtimes::{EndpointStatus, HandlerFeatures, RemovedEndpoint};

/// kubelet's renew interval for a 40 s lease.
pub const LEASE_RENEW_INTERVAL: Duration = Duration::from_secs(10);
pub const LEASE_DURATION_SECONDS: i32 = 40;
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// How often the status is recomputed even without a runtime change (kubelet's
/// `nodeStatusUpdateFrequency`).
pub const STATUS_CHECK_INTERVAL: Duration = Duration::from_secs(10);
/// An unchanged status is still reported this often (kubelet's `nodeStatusReportFrequency`): the
/// Lease is the heartbeat, so at scale an unchanged Node is not rewritten every minute.
pub const STATUS_REPORT_INTERVAL: Duration = Duration::from_secs(300);
/// What `status.nodeInfo.kubeletVersion` says: the Kubernetes API this agent follows, with
/// berth's version as semver build metadata.
pub const KUBELET_VERSION: &str = concat!("v1.33.0+berth-", env!("CARGO_PKG_VERSION"));
/// kubelet's default `--max-pods`.
pub const MAX_PODS: u32 = 110;
/// The prefix of the per-endpoint condition types: `RuntimeReady.berth.dev/<endpoint name>`.
pub const RUNTIME_CONDITION_PREFIX: &str = "RuntimeReady.berth.dev/";
/// The component named in events this agent writes.
pub const COMPONENT: &str = "berth-agent";

/// kubelet's hard eviction defaults, which it subtracts from capacity for allocatable.
const EVICTION_MEMORY_BYTES: u64 = 100 * 1024 * 1024;
const EVICTION_NODEFS_PERCENT: u64 = 10;

/// What the machine is, read once at start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Machine {
    pub hostname: String,
    pub internal_ip: Option<Ipv4Addr>,
    pub cpus: u32,
    pub memory_bytes: u64,
    /// Size of the filesystem holding the agent's root dir.
    pub ephemeral_storage_bytes: u64,
    pub machine_id: String,
    pub system_uuid: String,
    pub boot_id: String,
    pub kernel_version: String,
    pub os_image: String,
    /// Kubernetes' spelling (`GOOS` / `GOARCH`): `linux`, `amd64`.
    pub os: String,
    pub arch: String,
}

impl Machine {
    /// Reads `/proc`, `/sys`, `/etc`; what cannot be read stays empty (or zero).
    pub fn read(root_dir: &Path) -> Machine {
        let text = |path: &str| std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_default();
        Machine {
            hostname: crate::config::hostname(),
            internal_ip: internal_ip(),
            cpus: online_cpus(&text("/sys/devices/system/cpu/online"))
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32)),
            memory_bytes: mem_total_bytes(&text("/proc/meminfo")).unwrap_or(0),
            ephemeral_storage_bytes: filesystem_bytes(root_dir).unwrap_or(0),
            machine_id: text("/etc/machine-id"),
            system_uuid: [
                "/sys/class/dmi/id/product_uuid",
                "/proc/device-tree/vm,uuid",
                "/sys/firmware/devicetree/base/vm,uuid",
            ]
            .iter()
            .map(|p| text(p))
            .find(|s| !s.is_empty())
            .unwrap_or_default(),
            boot_id: text("/proc/sys/kernel/random/boot_id"),
            kernel_version: text("/proc/sys/kernel/osrelease"),
            os_image: os_image(&text("/etc/os-release")),
            os: std::env::consts::OS.to_string(),
            arch: go_arch(std::env::consts::ARCH).to_string(),
        }
    }

    /// kubelet's default node labels.
    pub fn labels(&self, node_name: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("kubernetes.io/hostname".to_string(), node_name.to_string()),
            ("kubernetes.io/os".to_string(), self.os.clone()),
            ("kubernetes.io/arch".to_string(), self.arch.clone()),
            ("beta.kubernetes.io/os".to_string(), self.os.clone()),
            ("beta.kubernetes.io/arch".to_string(), self.arch.clone()),
        ])
    }
}

/// The source address of the default route (no packet is sent), else the first non-loopback
/// IPv4 address the hostname resolves to.
fn internal_ip() -> Option<Ipv4Addr> {
    let usable = |ip: &Ipv4Addr| !ip.is_loopback() && !ip.is_unspecified();
    let routed = UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("198.51.100.1:9").and_then(|()| s.local_addr()))
        .ok()
        .and_then(|a| match a.ip() {
            IpAddr::V4(ip) => Some(ip),
            IpAddr::V6(_) => None,
        })
        .filter(usable);
    routed.or_else(|| {
        use std::net::ToSocketAddrs;
        (crate::config::hostname().as_str(), 0)
            .to_socket_addrs()
            .ok()?
            .filter_map(|a| match a.ip() {
                IpAddr::V4(ip) => Some(ip),
                IpAddr::V6(_) => None,
            })
            .find(usable)
    })
}

/// Counts `/sys/devices/system/cpu/online`'s ranges (`0-3,6`).
fn online_cpus(list: &str) -> Option<u32> {
    let mut count = 0;
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        count += match part.split_once('-') {
            Some((a, b)) => b.trim().parse::<u32>().ok()? - a.trim().parse::<u32>().ok()? + 1,
            None => {
                part.trim().parse::<u32>().ok()?;
                1
            }
        };
    }
    (count > 0).then_some(count)
}

fn mem_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The size of the filesystem holding `dir` (or its nearest existing ancestor).
fn filesystem_bytes(dir: &Path) -> Option<u64> {
    let existing = dir.ancestors().find(|p| p.exists())?;
    let stat = nix::sys::statvfs::statvfs(existing).ok()?;
    Some(stat.blocks() as u64 * stat.fragment_size() as u64)
}

/// `PRETTY_NAME` of os-release, as kubelet reports `osImage`.
fn os_image(os_release: &str) -> String {
    os_release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim().trim_matches('"').to_string())
        .unwrap_or_else(|| "Linux".to_string())
}

/// Rust's architecture names in Go's spelling, which Kubernetes uses.
fn go_arch(arch: &str) -> &str {
    match arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

/// Everything the status is computed from, at one moment.
#[derive(Clone, Debug)]
pub struct StatusInput<'a> {
    pub machine: &'a Machine,
    pub port: u16,
    pub partial_readiness: bool,
    /// In configured order.
    pub endpoints: &'a [(Arc<Endpoint>, EndpointStatus)],
    pub usable_handlers: &'a [(String, HandlerFeatures)],
    pub removed: &'a [RemovedEndpoint],
}

/// The Node's status as this agent reports it, with only the conditions this agent owns.
/// `previous` (the Node as last seen) keeps the transition times of conditions whose status did
/// not flip.
pub fn desired_status(input: &StatusInput<'_>, previous: Option<&NodeStatus>, now: jiff::Timestamp) -> NodeStatus {
    let m = input.machine;
    let previous_conditions: &[NodeCondition] = previous.and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    let condition = |kind: &str, ok: bool, reason: &str, message: String| {
        let status = if ok { "True" } else { "False" };
        let since = previous_conditions
            .iter()
            .find(|c| c.type_ == kind && c.status == status)
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or(Time(now));
        NodeCondition {
            type_: kind.to_string(),
            status: status.to_string(),
            reason: Some(reason.to_string()),
            message: Some(message),
            last_heartbeat_time: Some(Time(now)),
            last_transition_time: Some(since),
        }
    };

    let mut conditions = vec![
        condition(
            "MemoryPressure",
            false,
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available".into(),
        ),
        condition("DiskPressure", false, "KubeletHasNoDiskPressure", "kubelet has no disk pressure".into()),
        condition("PIDPressure", false, "KubeletHasSufficientPID", "kubelet has sufficient PID available".into()),
    ];
    let (ready, message) = readiness(input);
    let reason = if ready { "KubeletReady" } else { "KubeletNotReady" };
    conditions.push(condition("Ready", ready, reason, message));
    for (endpoint, status) in input.endpoints {
        let kind = format!("{RUNTIME_CONDITION_PREFIX}{}", endpoint.name);
        let (reason, message) = runtime_reason(endpoint, status);
        conditions.push(condition(&kind, status.ready, &reason, message));
    }
    for removed in input.removed {
        let kind = format!("{RUNTIME_CONDITION_PREFIX}{}", removed.name);
        let message = format!(
            "runtime {} ({}) was removed from the agent's configuration while {} pod(s) still run on it: {}",
            removed.name,
            removed.address,
            removed.pods.len(),
            removed.pods.join(", ")
        );
        conditions.push(condition(&kind, false, "RuntimeRemoved", message));
    }

    let mut addresses = Vec::new();
    if let Some(ip) = m.internal_ip {
        addresses.push(NodeAddress { type_: "InternalIP".into(), address: ip.to_string() });
    }
    if !m.hostname.is_empty() {
        addresses.push(NodeAddress { type_: "Hostname".into(), address: m.hostname.clone() });
    }

    let kib = |bytes: u64| Quantity(format!("{}Ki", bytes / 1024));
    let capacity = BTreeMap::from([
        ("cpu".to_string(), Quantity(m.cpus.to_string())),
        ("memory".to_string(), kib(m.memory_bytes)),
        ("pods".to_string(), Quantity(MAX_PODS.to_string())),
        ("ephemeral-storage".to_string(), kib(m.ephemeral_storage_bytes)),
    ]);
    let storage = m.ephemeral_storage_bytes;
    let allocatable = BTreeMap::from([
        ("cpu".to_string(), Quantity(m.cpus.to_string())),
        ("memory".to_string(), kib(m.memory_bytes.saturating_sub(EVICTION_MEMORY_BYTES))),
        ("pods".to_string(), Quantity(MAX_PODS.to_string())),
        ("ephemeral-storage".to_string(), Quantity((storage - storage * EVICTION_NODEFS_PERCENT / 100).to_string())),
    ]);

    let runtime_versions: Vec<String> = input
        .endpoints
        .iter()
        .filter(|(_, s)| !s.runtime_name.is_empty())
        .map(|(_, s)| format!("{}://{}", s.runtime_name, s.runtime_version))
        .collect();
    let node_info = NodeSystemInfo {
        architecture: m.arch.clone(),
        boot_id: m.boot_id.clone(),
        container_runtime_version: runtime_versions.join(", "),
        kernel_version: m.kernel_version.clone(),
        kube_proxy_version: String::new(),
        kubelet_version: KUBELET_VERSION.to_string(),
        machine_id: m.machine_id.clone(),
        operating_system: m.os.clone(),
        os_image: m.os_image.clone(),
        swap: None,
        system_uuid: m.system_uuid.clone(),
    };
    let runtime_handlers = input
        .usable_handlers
        .iter()
        .map(|(name, features)| NodeRuntimeHandler {
            name: Some(name.clone()),
            features: Some(NodeRuntimeHandlerFeatures {
                recursive_read_only_mounts: Some(features.recursive_read_only_mounts),
                user_namespaces: Some(features.user_namespaces),
            }),
        })
        .collect();

    NodeStatus {
        addresses: Some(addresses),
        allocatable: Some(allocatable),
        capacity: Some(capacity),
        conditions: Some(conditions),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint { port: i32::from(input.port) }),
        }),
        node_info: Some(node_info),
        runtime_handlers: Some(runtime_handlers),
        ..Default::default()
    }
}

/// `Ready` and its message: all runtimes ready, or (with partial readiness) at least one.
fn readiness(input: &StatusInput<'_>) -> (bool, String) {
    if input.endpoints.is_empty() {
        return (false, "no container runtime is configured".into());
    }
    let unready: Vec<String> = input
        .endpoints
        .iter()
        .filter(|(_, s)| !s.ready)
        .map(|(e, s)| {
            let (reason, message) = runtime_reason(e, s);
            format!("{}: {reason}: {message}", e.name)
        })
        .collect();
    let any_ready = unready.len() < input.endpoints.len();
    if unready.is_empty() {
        (true, "berth agent is posting ready status".into())
    } else if input.partial_readiness && any_ready {
        (
            true,
            format!(
                "berth agent is posting ready status; partial readiness, container runtime not ready: {}",
                unready.join("; ")
            ),
        )
    } else {
        (false, format!("container runtime not ready: {}", unready.join("; ")))
    }
}

/// A runtime condition's reason and message.
fn runtime_reason(endpoint: &Endpoint, status: &EndpointStatus) -> (String, String) {
    if status.ready {
        let handlers: Vec<&str> = status.handlers.iter().filter(|h| !h.is_empty()).map(String::as_str).collect();
        let message = format!(
            "{}://{} on {} is ready, handlers: {}",
            status.runtime_name,
            status.runtime_version,
            endpoint.address,
            if handlers.is_empty() { "(default only)".to_string() } else { handlers.join(", ") }
        );
        return ("RuntimeReady".into(), message);
    }
    if status.reason.is_empty() && status.message.is_empty() {
        return ("RuntimeStatusUnknown".into(), format!("the status of {} has not been read yet", endpoint.address));
    }
    (status.reason.clone(), status.message.clone())
}

/// The strategic merge patch (`nodes/<name>/status`) that makes the Node's status `desired`
/// (from [`desired_status`]), given `previous`, the Node's status as last seen.
///
/// Conditions merge by type: the patch carries only this agent's own, so the server keeps the
/// conditions others set as they are now. A `RuntimeReady.berth.dev/*` condition in `previous`
/// that `desired` lacks (its endpoint left the configuration) gets a `$patch: delete` element.
/// Addresses are replaced whole (`$patch: replace`), as kubelet does, since their merge key
/// `type` is not unique; `runtimeHandlers` is an atomic list and replaced anyway.
pub fn status_patch(desired: &NodeStatus, previous: Option<&NodeStatus>) -> serde_json::Value {
    let mut patch = serde_json::json!({ "status": desired });
    let status = &mut patch["status"];
    let ours = desired.conditions.as_deref().unwrap_or_default();
    let stale = previous
        .and_then(|p| p.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|c| c.type_.starts_with(RUNTIME_CONDITION_PREFIX) && !ours.iter().any(|o| o.type_ == c.type_))
        .map(|c| serde_json::json!({ "type": c.type_, "$patch": "delete" }));
    if let Some(conditions) = status.get_mut("conditions").and_then(serde_json::Value::as_array_mut) {
        conditions.extend(stale);
    }
    if let Some(addresses) = status.get_mut("addresses").and_then(serde_json::Value::as_array_mut) {
        addresses.push(serde_json::json!({ "$patch": "replace" }));
    }
    patch
}

/// The status without heartbeat times, to tell whether anything worth reporting changed.
fn without_heartbeats(status: &NodeStatus) -> NodeStatus {
    let mut status = status.clone();
    for c in status.conditions.iter_mut().flatten() {
        c.last_heartbeat_time = None;
    }
    status
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("registering node {node}")]
    Register {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("updating the status of node {node}")]
    Status {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("renewing lease {LEASE_NAMESPACE}/{node}")]
    Lease {
        node: String,
        #[source]
        source: kube::Error,
    },
}

/// Keeps this node's Node and Lease: [`NodeReporter::run`] never returns.
pub struct NodeReporter {
    ctx: Context,
    machine: Machine,
    nodes: Api<Node>,
    leases: Api<Lease>,
    /// The Node as the API server last returned it.
    node: Option<Node>,
    lease: Option<Lease>,
    /// What was last reported, heartbeats left out, and when.
    reported: Option<(NodeStatus, Instant)>,
}

fn is_status(e: &kube::Error, check: fn(&kube::core::Status) -> bool) -> bool {
    matches!(e, kube::Error::Api(s) if check(s))
}

impl NodeReporter {
    pub fn new(ctx: Context) -> NodeReporter {
        let machine = Machine::read(&ctx.root_dir);
        let nodes = Api::all(ctx.client.clone());
        let leases = Api::namespaced(ctx.client.clone(), LEASE_NAMESPACE);
        NodeReporter { ctx, machine, nodes, leases, node: None, lease: None, reported: None }
    }

    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    fn status_now(&self) -> NodeStatus {
        let runtimes = &self.ctx.runtimes;
        let endpoints = runtimes.endpoints();
        let usable = runtimes.usable_handlers();
        let removed = runtimes.removed_with_pods();
        let config = self.ctx.config.borrow().clone();
        let input = StatusInput {
            machine: &self.machine,
            port: self.ctx.port,
            partial_readiness: config.partial_readiness,
            endpoints: &endpoints,
            usable_handlers: &usable,
            removed: &removed,
        };
        let previous = self.node.as_ref().and_then(|n| n.status.as_ref());
        desired_status(&input, previous, jiff::Timestamp::now())
    }

    /// Creates the Node, or adopts the existing one (kubelet's default labels set on it).
    pub async fn register(&mut self) -> Result<(), NodeError> {
        let name = self.ctx.node_name.clone();
        let labels = self.machine.labels(&name);
        let node = Node {
            metadata: ObjectMeta { name: Some(name.clone()), labels: Some(labels.clone()), ..Default::default() },
            spec: None,
            status: Some(self.status_now()),
        };
        let err = |source| NodeError::Register { node: name.clone(), source };
        match self.nodes.create(&PostParams::default(), &node).await {
            Ok(created) => {
                tracing::info!(node = %name, "registered the node");
                self.reported = created.status.as_ref().map(|s| (without_heartbeats(s), Instant::now()));
                self.node = Some(created);
                Ok(())
            }
            Err(e) if is_status(&e, kube::core::Status::is_already_exists) => {
                let patch = serde_json::json!({ "metadata": { "labels": labels } });
                let adopted =
                    self.nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(err)?;
                tracing::info!(node = %name, "adopted the existing node");
                self.node = Some(adopted);
                self.reported = None;
                self.report_status(true).await
            }
            Err(e) => Err(err(e)),
        }
    }

    /// Patches the status if it changed since the last report, or `force`, or the last report is
    /// older than [`STATUS_REPORT_INTERVAL`]. A Node deleted meanwhile is registered again.
    pub async fn report_status(&mut self, force: bool) -> Result<(), NodeError> {
        let status = self.status_now();
        let essential = without_heartbeats(&status);
        let due = match &self.reported {
            None => true,
            Some((last, at)) => force || *last != essential || at.elapsed() >= STATUS_REPORT_INTERVAL,
        };
        if !due {
            return Ok(());
        }
        let name = self.ctx.node_name.clone();
        let patch = status_patch(&status, self.node.as_ref().and_then(|n| n.status.as_ref()));
        match self.nodes.patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch)).await {
            Ok(node) => {
                let changed = self.reported.as_ref().is_none_or(|(last, _)| *last != essential);
                if changed {
                    log_status(&name, &status);
                }
                self.node = Some(node);
                self.reported = Some((essential, Instant::now()));
                Ok(())
            }
            Err(e) if is_status(&e, kube::core::Status::is_not_found) => {
                tracing::warn!(node = %name, "the node was deleted; registering it again");
                self.node = None;
                self.lease = None;
                Box::pin(self.register()).await
            }
            Err(source) => Err(NodeError::Status { node: name, source }),
        }
    }

    /// Renews (or creates) the Lease `kube-node-lease/<node>`, owned by the Node.
    pub async fn renew_lease(&mut self) -> Result<(), NodeError> {
        let name = self.ctx.node_name.clone();
        let err = |source| NodeError::Lease { node: name.clone(), source };
        let now = MicroTime(jiff::Timestamp::now());
        let owner = self.node.as_ref().and_then(|n| n.metadata.uid.clone()).map(|uid| OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: name.clone(),
            uid,
            ..Default::default()
        });
        let spec = |acquire: Option<MicroTime>| LeaseSpec {
            holder_identity: Some(name.clone()),
            lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
            renew_time: Some(now.clone()),
            acquire_time: acquire,
            ..Default::default()
        };
        let current = match self.lease.take() {
            Some(lease) => Some(lease),
            None => self.leases.get_opt(&name).await.map_err(err)?,
        };
        let result = match current {
            Some(mut lease) => {
                let acquire = lease.spec.as_ref().and_then(|s| s.acquire_time.clone());
                lease.spec = Some(spec(acquire.or(Some(now.clone()))));
                if let Some(owner) = owner {
                    lease.metadata.owner_references = Some(vec![owner]);
                }
                self.leases.replace(&name, &PostParams::default(), &lease).await
            }
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(LEASE_NAMESPACE.into()),
                        owner_references: owner.map(|o| vec![o]),
                        ..Default::default()
                    },
                    spec: Some(spec(Some(now.clone()))),
                };
                self.leases.create(&PostParams::default(), &lease).await
            }
        };
        // On any error the next renewal reads the Lease afresh (a conflict means it changed).
        self.lease = Some(result.map_err(err)?);
        Ok(())
    }

    /// Registers (retrying with back-off until it works), then keeps the Lease and the status.
    pub async fn run(mut self) {
        let mut backoff = Duration::from_millis(200);
        while let Err(e) = self.register().await {
            tracing::warn!(error = %berth_common::error::error_chain(&e), retry_in = ?backoff, "node registration failed");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(7));
        }
        if let Err(e) = self.renew_lease().await {
            tracing::warn!(error = %berth_common::error::error_chain(&e), "lease renewal failed");
        }
        let mut lease_tick = tokio::time::interval(LEASE_RENEW_INTERVAL);
        lease_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        lease_tick.reset();
        let mut status_tick = tokio::time::interval(STATUS_CHECK_INTERVAL);
        status_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        status_tick.reset();
        let mut runtime_changes = self.ctx.runtimes.changes();
        let mut config_changes = self.ctx.config.clone();
        loop {
            tokio::select! {
                _ = lease_tick.tick() => {
                    if let Err(e) = self.renew_lease().await {
                        tracing::warn!(error = %berth_common::error::error_chain(&e), "lease renewal failed");
                    }
                    continue;
                }
                _ = status_tick.tick() => {}
                Ok(()) = runtime_changes.changed() => {
                    // Several endpoints report within moments of each other: one patch for all.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    runtime_changes.mark_unchanged();
                }
                Ok(()) = config_changes.changed() => {
                    config_changes.mark_unchanged();
                }
            }
            if let Err(e) = self.report_status(false).await {
                tracing::warn!(error = %berth_common::error::error_chain(&e), "node status update failed");
            }
        }
    }
}

fn log_status(node: &str, status: &NodeStatus) {
    let conditions = status.conditions.as_deref().unwrap_or_default();
    let ready = conditions.iter().find(|c| c.type_ == "Ready");
    let handlers: Vec<&str> =
        status.runtime_handlers.iter().flatten().filter_map(|h| h.name.as_deref()).filter(|h| !h.is_empty()).collect();
    tracing::info!(
        node,
        ready = ready.map(|c| c.status.as_str()).unwrap_or(""),
        message = ready.and_then(|c| c.message.as_deref()).unwrap_or(""),
        handlers = %handlers.join(","),
        "node status reported"
    );
}

/// Writes a core/v1 Event about this node (kubelet's node reference: kind Node, UID = name).
pub async fn node_event(client: &kube::Client, node: &str, type_: &str, reason: &str, message: &str) {
    let now = jiff::Timestamp::now();
    let event = Event {
        metadata: ObjectMeta {
            name: Some(format!("{node}.{:x}", now.as_nanosecond())),
            namespace: Some("default".into()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            kind: Some("Node".into()),
            name: Some(node.into()),
            uid: Some(node.into()),
            ..Default::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some(type_.into()),
        source: Some(EventSource { component: Some(COMPONENT.into()), host: Some(node.into()) }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(node.into()),
        ..Default::default()
    };
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    if let Err(e) = events.create(&PostParams::default(), &event).await {
        tracing::warn!(reason, error = %berth_common::error::error_chain(&e), "could not record a node event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> Machine {
        Machine {
            hostname: "vm".into(),
            internal_ip: Some(Ipv4Addr::new(192, 0, 2, 2)),
            cpus: 2,
            memory_bytes: 4 * 1024 * 1024 * 1024,
            ephemeral_storage_bytes: 100 * 1024 * 1024 * 1024,
            machine_id: "m".into(),
            system_uuid: String::new(),
            boot_id: "b".into(),
            kernel_version: "6.1.0".into(),
            os_image: "Debian GNU/Linux 12 (bookworm)".into(),
            os: "linux".into(),
            arch: "amd64".into(),
        }
    }

    /// Only inside a tokio runtime: a lazy gRPC channel spawns its worker.
    fn endpoint(name: &str) -> Arc<Endpoint> {
        Arc::new(Endpoint::connect_lazy("container", name, &format!("unix:///run/{name}.sock"), "").unwrap())
    }

    fn ready(name: &str, version: &str, handlers: &[&str]) -> EndpointStatus {
        EndpointStatus {
            ready: true,
            handlers: handlers.iter().map(|h| h.to_string()).collect(),
            runtime_name: name.into(),
            runtime_version: version.into(),
            ..Default::default()
        }
    }

    fn down(name: &str, version: &str) -> EndpointStatus {
        EndpointStatus {
            ready: false,
            reason: "RuntimeUnreachable".into(),
            message: "CRI Version on unix:///run/x.sock failed: Unavailable".into(),
            ..ready(name, version, &[])
        }
    }

    fn status(
        endpoints: &[(Arc<Endpoint>, EndpointStatus)],
        partial: bool,
        previous: Option<&NodeStatus>,
    ) -> NodeStatus {
        let m = machine();
        let usable: Vec<(String, HandlerFeatures)> = endpoints
            .iter()
            .filter(|(_, s)| s.ready)
            .flat_map(|(_, s)| s.handlers.iter().map(|h| (h.clone(), HandlerFeatures::default())))
            .collect();
        let input = StatusInput {
            machine: &m,
            port: 10250,
            partial_readiness: partial,
            endpoints,
            usable_handlers: &usable,
            removed: &[],
        };
        desired_status(&input, previous, jiff::Timestamp::from_second(1_700_000_000).unwrap())
    }

    fn cond<'a>(s: &'a NodeStatus, kind: &str) -> &'a NodeCondition {
        s.conditions.as_ref().unwrap().iter().find(|c| c.type_ == kind).unwrap_or_else(|| panic!("no {kind}"))
    }

    #[tokio::test]
    async fn all_ready_runtimes_make_the_node_ready_and_list_every_runtime_version() {
        let endpoints = vec![
            (endpoint("berth"), ready("berth", "0.1.0", &["", "runc", "gvisor"])),
            (endpoint("containerd"), ready("containerd", "1.6.20", &["", "runc"])),
        ];
        let s = status(&endpoints, false, None);
        let r = cond(&s, "Ready");
        assert_eq!((r.status.as_str(), r.reason.as_deref()), ("True", Some("KubeletReady")));
        assert_eq!(cond(&s, "RuntimeReady.berth.dev/containerd").status, "True");
        assert_eq!(s.node_info.as_ref().unwrap().container_runtime_version, "berth://0.1.0, containerd://1.6.20");
        assert_eq!(s.daemon_endpoints.unwrap().kubelet_endpoint.unwrap().port, 10250);
        let addresses: Vec<_> = s.addresses.unwrap().into_iter().map(|a| (a.type_, a.address)).collect();
        assert_eq!(addresses, [("InternalIP".into(), "192.0.2.2".into()), ("Hostname".into(), "vm".into())]);
        assert_eq!(s.capacity.as_ref().unwrap()["pods"].0, "110");
        assert_eq!(s.allocatable.as_ref().unwrap()["memory"].0, format!("{}Ki", 4 * 1024 * 1024 - 100 * 1024));
    }

    #[tokio::test]
    async fn one_runtime_down_makes_the_node_not_ready_naming_it_unless_partial_readiness() {
        let endpoints = vec![
            (endpoint("berth"), ready("berth", "0.1.0", &["", "runc"])),
            (endpoint("containerd"), down("containerd", "1.6.20")),
        ];
        let s = status(&endpoints, false, None);
        let r = cond(&s, "Ready");
        assert_eq!((r.status.as_str(), r.reason.as_deref()), ("False", Some("KubeletNotReady")));
        assert!(r.message.as_ref().unwrap().contains("containerd: RuntimeUnreachable: CRI Version"), "{r:?}");
        let c = cond(&s, "RuntimeReady.berth.dev/containerd");
        assert_eq!((c.status.as_str(), c.reason.as_deref()), ("False", Some("RuntimeUnreachable")));
        assert_eq!(
            s.node_info.as_ref().unwrap().container_runtime_version,
            "berth://0.1.0, containerd://1.6.20",
            "a runtime down is still named by its last version"
        );

        let s = status(&endpoints, true, None);
        let r = cond(&s, "Ready");
        assert_eq!(r.status, "True");
        assert!(r.message.as_ref().unwrap().contains("partial readiness"), "{r:?}");
    }

    #[tokio::test]
    async fn no_ready_runtime_is_not_ready_even_with_partial_readiness() {
        let endpoints = vec![(endpoint("berth"), down("berth", "0.1.0"))];
        assert_eq!(cond(&status(&endpoints, true, None), "Ready").status, "False");
        assert_eq!(cond(&status(&[], true, None), "Ready").status, "False");
    }

    #[tokio::test]
    async fn transition_times_move_only_when_a_status_flips() {
        let up = vec![(endpoint("berth"), ready("berth", "0.1.0", &["runc"]))];
        let mut first = status(&up, false, None);
        let old = Time(jiff::Timestamp::from_second(1_600_000_000).unwrap());
        for c in first.conditions.iter_mut().flatten() {
            c.last_transition_time = Some(old.clone());
        }
        let again = status(&up, false, Some(&first));
        assert_eq!(cond(&again, "Ready").last_transition_time.as_ref(), Some(&old));
        let flipped = status(&[(endpoint("berth"), down("berth", "0.1.0"))], false, Some(&first));
        assert_ne!(cond(&flipped, "Ready").last_transition_time.as_ref(), Some(&old));
        assert_eq!(cond(&flipped, "MemoryPressure").last_transition_time.as_ref(), Some(&old));
    }

    fn kinds(s: &NodeStatus) -> Vec<&str> {
        s.conditions.iter().flatten().map(|c| c.type_.as_str()).collect()
    }

    #[tokio::test]
    async fn the_status_holds_only_this_agents_conditions_and_none_of_a_removed_runtime() {
        let up = vec![(endpoint("berth"), ready("berth", "0.1.0", &["runc"]))];
        let mut previous = status(&[(endpoint("old"), ready("x", "1", &[]))], false, None);
        previous.conditions.as_mut().unwrap().push(NodeCondition {
            type_: "NetworkUnavailable".into(),
            status: "False".into(),
            ..Default::default()
        });
        let s = status(&up, false, Some(&previous));
        assert_eq!(
            kinds(&s),
            ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready", "RuntimeReady.berth.dev/berth"]
        );
    }

    /// The patch applied as the API server applies a strategic merge patch to a Node.
    fn patched(node: &NodeStatus, patch: &serde_json::Value) -> NodeStatus {
        let node = serde_json::json!({ "metadata": { "name": "vm" }, "status": node });
        let out = berth_api::strategic_merge::apply(&berth_api::resources::NODES, &node, patch).unwrap();
        serde_json::from_value(out["status"].clone()).unwrap()
    }

    #[tokio::test]
    async fn the_patch_deletes_a_removed_runtimes_condition_and_keeps_conditions_others_set() {
        let both = vec![
            (endpoint("berth"), ready("berth", "0.1.0", &["runc"])),
            (endpoint("second"), ready("berth", "0.1.0", &["alt"])),
        ];
        // What the agent last saw, and the Node now: another writer added a condition since.
        let seen = status(&both, false, None);
        let mut server = seen.clone();
        server.conditions.as_mut().unwrap().push(NodeCondition {
            type_: "NetworkUnavailable".into(),
            status: "False".into(),
            reason: Some("RouteCreated".into()),
            ..Default::default()
        });

        let one = vec![(endpoint("berth"), ready("berth", "0.1.0", &["runc"]))];
        let desired = status(&one, false, Some(&seen));
        let patch = status_patch(&desired, Some(&seen));
        let deletes: Vec<&serde_json::Value> =
            patch["status"]["conditions"].as_array().unwrap().iter().filter(|c| c.get("$patch").is_some()).collect();
        assert_eq!(deletes, [&serde_json::json!({"type": "RuntimeReady.berth.dev/second", "$patch": "delete"})]);
        let out = patched(&server, &patch);
        assert_eq!(
            kinds(&out),
            [
                "MemoryPressure",
                "DiskPressure",
                "PIDPressure",
                "Ready",
                "RuntimeReady.berth.dev/berth",
                "NetworkUnavailable"
            ]
        );
        assert_eq!(cond(&out, "NetworkUnavailable").reason.as_deref(), Some("RouteCreated"));
        let handlers: Vec<_> = out.runtime_handlers.iter().flatten().filter_map(|h| h.name.clone()).collect();
        assert_eq!(handlers, ["runc"], "runtimeHandlers is replaced whole");

        // Applied again (a retry after a lost response): nothing left to delete, nothing else changes.
        assert_eq!(patched(&out, &patch), out);
    }

    #[tokio::test]
    async fn the_patch_replaces_the_addresses_whole() {
        let up = vec![(endpoint("berth"), ready("berth", "0.1.0", &["runc"]))];
        let mut server = status(&up, false, None);
        server
            .addresses
            .as_mut()
            .unwrap()
            .push(NodeAddress { type_: "ExternalIP".into(), address: "203.0.113.9".into() });
        let desired = status(&up, false, Some(&server));
        let out = patched(&server, &status_patch(&desired, Some(&server)));
        assert_eq!(out.addresses, desired.addresses);
    }

    #[tokio::test]
    async fn a_removed_runtime_with_pods_keeps_a_false_condition_naming_them() {
        let m = machine();
        let removed = vec![RemovedEndpoint {
            name: "containerd".into(),
            address: "unix:///run/containerd.sock".into(),
            pods: vec!["uid-1".into()],
        }];
        let endpoints = vec![(endpoint("berth"), ready("berth", "0.1.0", &["runc"]))];
        let input = StatusInput {
            machine: &m,
            port: 1,
            partial_readiness: false,
            endpoints: &endpoints,
            usable_handlers: &[],
            removed: &removed,
        };
        let s = desired_status(&input, None, jiff::Timestamp::now());
        let c = cond(&s, "RuntimeReady.berth.dev/containerd");
        assert_eq!((c.status.as_str(), c.reason.as_deref()), ("False", Some("RuntimeRemoved")));
        assert!(c.message.as_ref().unwrap().contains("1 pod(s) still run on it: uid-1"), "{c:?}");
        assert_eq!(cond(&s, "Ready").status, "True", "a removed runtime does not count for readiness");
    }

    #[test]
    fn machine_files_parse_as_kubelet_reads_them() {
        assert_eq!(online_cpus("0-3,6\n"), Some(5));
        assert_eq!(online_cpus("0"), Some(1));
        assert_eq!(online_cpus(""), None);
        assert_eq!(mem_total_bytes("MemTotal:       8024420 kB\nMemFree: 1 kB\n"), Some(8024420 * 1024));
        assert_eq!(
            os_image("NAME=\"Debian\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n"),
            "Debian GNU/Linux 12 (bookworm)"
        );
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(go_arch("aarch64"), "arm64");
    }

    #[test]
    fn this_machine_reads_with_cpus_memory_and_storage() {
        let dir = tempfile::tempdir().unwrap();
        let m = Machine::read(&dir.path().join("not/yet/created"));
        assert!(m.cpus >= 1);
        assert!(m.memory_bytes > 0);
        assert!(m.ephemeral_storage_bytes > 0, "the nearest existing ancestor's filesystem");
        assert!(!m.boot_id.is_empty());
        assert_eq!(m.labels("n")["kubernetes.io/hostname"], "n");
    }
}
