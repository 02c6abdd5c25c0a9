//! The runtime manager (seed `002_…`'s `RuntimeManager`): which CRI endpoint serves which pod.
//!
//! Endpoints keep their configured order; the first endpoint of a workload type is its default.
//! Each endpoint's last CRI `Status` says whether it is ready and which handlers it serves; a pod's
//! handler selects the first ready endpoint serving it, unless the pod pins an endpoint by name.
//! The pod→endpoint cache remembers where each pod's sandbox lives, so later calls (stop, exec,
//! logs) go to the same runtime even if the configuration changed meanwhile.
//!
//! [`probe`] reads an endpoint's `Version` and `Status` into an [`EndpointStatus`]; the agent
//! calls it every few seconds and after every configuration change.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use k8s_cri::v1 as cri;

use crate::endpoint::Endpoint;

/// The pod annotation naming the endpoint a pod must run on (the seed's `runtimeServiceName`).
pub const SERVICE_ANNOTATION: &str = "runtime.berth.dev/service";

/// What the agent last learned from an endpoint's `Version` and `Status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointStatus {
    /// `RuntimeReady` (and, for `container` workloads, `NetworkReady`) were true.
    pub ready: bool,
    /// Why it is not ready (CRI condition reason, or the call's error), empty when ready.
    pub reason: String,
    pub message: String,
    /// Handlers served: the runtime's `runtime_handlers`, or the endpoint's configured `handlers`
    /// for runtimes that report none (containerd 1.6). `""` is the runtime's default handler.
    pub handlers: Vec<String>,
    /// CRI `runtime_name` / `runtime_version` from `Version`, e.g. `berth` / `0.1.0`.
    pub runtime_name: String,
    pub runtime_version: String,
    /// What the runtime says each handler supports (absent: nothing).
    pub handler_features: BTreeMap<String, HandlerFeatures>,
}

/// CRI `RuntimeHandlerFeatures`, which the Node's `status.runtimeHandlers` repeats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandlerFeatures {
    pub recursive_read_only_mounts: bool,
    pub user_namespaces: bool,
}

/// An endpoint removed from the configuration while pods still ran on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemovedEndpoint {
    pub name: String,
    pub address: String,
    /// UIDs of the pods the cache still places on it.
    pub pods: Vec<String>,
}

/// Why no endpoint can run a pod.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// Reason `RuntimeHandlerNotFound`.
    #[error("runtime handler {handler:?} is not served by any runtime on node {node} (available: {})", available.join(", "))]
    HandlerNotFound { handler: String, node: String, available: Vec<String> },
    /// Reason `RuntimeHandlerNotFound`: the pinned endpoint exists but does not serve the handler.
    #[error("runtime handler {handler:?} is not served by runtime {endpoint} on node {node} (it serves: {})", serves.join(", "))]
    PinnedWithoutHandler { handler: String, endpoint: String, node: String, serves: Vec<String> },
    /// Reason `RuntimeHandlerNotFound`: the pod pins an endpoint this node does not have.
    #[error("runtime {endpoint:?} named by annotation {SERVICE_ANNOTATION} is not configured on node {node} (configured: {})", configured.join(", "))]
    UnknownEndpoint { endpoint: String, node: String, configured: Vec<String> },
}

impl SelectError {
    /// The pod condition / event reason for this error.
    pub fn reason(&self) -> &'static str {
        "RuntimeHandlerNotFound"
    }
}

struct Entry {
    endpoint: Arc<Endpoint>,
    status: EndpointStatus,
    /// Its pods have been listed since it was configured, so the pod cache knows what it holds.
    inventoried: bool,
}

/// The endpoints of this node, their last status, and the pod→endpoint cache.
pub struct RuntimeManager {
    node_name: String,
    entries: RwLock<Vec<Entry>>,
    /// Pod UID → endpoint name.
    pods: Mutex<HashMap<String, String>>,
    /// Endpoints removed while pods were on them: name → address.
    removed: Mutex<BTreeMap<String, String>>,
    /// Bumped whenever endpoints or their statuses change, so pods waiting for a handler retry.
    changes: tokio::sync::watch::Sender<u64>,
}

impl RuntimeManager {
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            entries: RwLock::new(Vec::new()),
            pods: Mutex::new(HashMap::new()),
            removed: Mutex::new(BTreeMap::new()),
            changes: tokio::sync::watch::channel(0).0,
        }
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Replaces the configured endpoints, keeping the last status of endpoints that stay (same
    /// name, workload type and sockets; their clients too, unless only their configured handlers
    /// changed). Returns the names of endpoints that went away; those with pods still cached on
    /// them are remembered for [`Self::removed_with_pods`].
    pub fn set_endpoints(&self, endpoints: Vec<Endpoint>) -> Vec<String> {
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        let mut old: Vec<Entry> = std::mem::take(&mut *entries);
        for endpoint in endpoints {
            let kept = old.iter().position(|e| e.endpoint.same_runtime(&endpoint));
            let entry = match kept {
                Some(i) => {
                    let mut entry = old.remove(i);
                    if entry.endpoint.configured_handlers != endpoint.configured_handlers {
                        entry.endpoint = Arc::new(endpoint);
                    }
                    entry
                }
                None => Entry { endpoint: Arc::new(endpoint), status: EndpointStatus::default(), inventoried: false },
            };
            entries.push(entry);
        }
        let configured: Vec<String> = entries.iter().map(|e| e.endpoint.name.clone()).collect();
        drop(entries);
        let gone: Vec<Entry> = old.into_iter().filter(|e| !configured.contains(&e.endpoint.name)).collect();
        {
            let mut removed = self.removed.lock().unwrap_or_else(|e| e.into_inner());
            removed.retain(|name, _| !configured.contains(name));
            for entry in &gone {
                if !self.pods_on(&entry.endpoint.name).is_empty() {
                    removed.insert(entry.endpoint.name.clone(), entry.endpoint.address.clone());
                }
            }
        }
        self.changes.send_modify(|n| *n += 1);
        gone.into_iter().map(|e| e.endpoint.name.clone()).collect()
    }

    /// Endpoints removed from the configuration that the pod cache still places pods on, by
    /// name; an endpoint leaves this list once its last pod is forgotten.
    pub fn removed_with_pods(&self) -> Vec<RemovedEndpoint> {
        let mut removed = self.removed.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        removed.retain(|name, address| {
            let pods = self.pods_on(name);
            let keep = !pods.is_empty();
            if keep {
                out.push(RemovedEndpoint { name: name.clone(), address: address.clone(), pods });
            }
            keep
        });
        out
    }

    /// As [`Self::update_status`], but only while `endpoint` is still the configured one of its
    /// name: a probe that raced with a configuration change is dropped.
    pub fn update_status_of(&self, endpoint: &Arc<Endpoint>, status: EndpointStatus) {
        let current = self.endpoint(&endpoint.name).is_some_and(|e| e.same_runtime(endpoint));
        if current {
            self.update_status(&endpoint.name, status);
        }
    }

    /// Records what an endpoint's `Status`/`Version` said; ignored for unknown names.
    pub fn update_status(&self, name: &str, status: EndpointStatus) {
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = entries.iter_mut().find(|e| e.endpoint.name == name) else { return };
        if entry.status != status {
            entry.status = status;
            drop(entries);
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// Records that `endpoint`'s pods were listed into the pod cache (dropped if the endpoint was
    /// replaced meanwhile).
    pub fn mark_inventoried(&self, endpoint: &Arc<Endpoint>) {
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = entries.iter_mut().find(|e| e.endpoint.same_runtime(endpoint)) else { return };
        if !entry.inventoried {
            entry.inventoried = true;
            drop(entries);
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// Endpoints whose pods have not been listed yet (unreachable since they were configured):
    /// a pod found on none of the others may still run on one of them.
    pub fn uninventoried(&self) -> Vec<Arc<Endpoint>> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        entries.iter().filter(|e| !e.inventoried).map(|e| Arc::clone(&e.endpoint)).collect()
    }

    /// The endpoint for a pod with `handler` (from its RuntimeClass, `""` without one), pinned to
    /// the endpoint named `pinned` if the pod's annotation says so. Only `container` workloads.
    pub fn select(&self, handler: &str, pinned: Option<&str>) -> Result<Arc<Endpoint>, SelectError> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        let containers = entries.iter().filter(|e| e.endpoint.workload_type == "container");
        if let Some(name) = pinned.filter(|p| !p.is_empty() && *p != "default") {
            let Some(entry) = entries.iter().find(|e| e.endpoint.name == name) else {
                return Err(SelectError::UnknownEndpoint {
                    endpoint: name.to_string(),
                    node: self.node_name.clone(),
                    configured: entries.iter().map(|e| e.endpoint.name.clone()).collect(),
                });
            };
            if serves(&entry.status, handler) {
                return Ok(Arc::clone(&entry.endpoint));
            }
            return Err(SelectError::PinnedWithoutHandler {
                handler: handler.to_string(),
                endpoint: name.to_string(),
                node: self.node_name.clone(),
                serves: named_handlers(&entry.status),
            });
        }
        if handler.is_empty() {
            // No RuntimeClass: the default (first) container endpoint, if it is ready.
            if let Some(first) = containers.clone().next().filter(|e| e.status.ready) {
                return Ok(Arc::clone(&first.endpoint));
            }
        }
        if let Some(entry) = containers.clone().find(|e| e.status.ready && serves(&e.status, handler)) {
            return Ok(Arc::clone(&entry.endpoint));
        }
        Err(SelectError::HandlerNotFound {
            handler: handler.to_string(),
            node: self.node_name.clone(),
            available: self.available_handlers_of(&entries),
        })
    }

    /// Handlers usable now (served by a ready endpoint), sorted, without the unnamed default.
    pub fn available_handlers(&self) -> Vec<String> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        self.available_handlers_of(&entries)
    }

    fn available_handlers_of(&self, entries: &[Entry]) -> Vec<String> {
        let mut all: Vec<String> =
            entries.iter().filter(|e| e.status.ready).flat_map(|e| named_handlers(&e.status)).collect();
        all.sort();
        all.dedup();
        all
    }

    /// Handlers usable now, as the Node's `status.runtimeHandlers` lists them: every handler of
    /// every ready endpoint in configured order (the unnamed default `""` included, as the
    /// runtimes report it), each once, with the features of the first endpoint serving it.
    pub fn usable_handlers(&self) -> Vec<(String, HandlerFeatures)> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(String, HandlerFeatures)> = Vec::new();
        for entry in entries.iter().filter(|e| e.status.ready) {
            for handler in &entry.status.handlers {
                if !out.iter().any(|(h, _)| h == handler) {
                    let features = entry.status.handler_features.get(handler).copied().unwrap_or_default();
                    out.push((handler.clone(), features));
                }
            }
        }
        out
    }

    pub fn endpoint(&self, name: &str) -> Option<Arc<Endpoint>> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        entries.iter().find(|e| e.endpoint.name == name).map(|e| Arc::clone(&e.endpoint))
    }

    /// Every configured endpoint with its last status, in configured order.
    pub fn endpoints(&self) -> Vec<(Arc<Endpoint>, EndpointStatus)> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        entries.iter().map(|e| (Arc::clone(&e.endpoint), e.status.clone())).collect()
    }

    /// Remembers that the pod's sandbox lives on `endpoint`.
    pub fn remember(&self, pod_uid: &str, endpoint: &str) {
        self.pods.lock().unwrap_or_else(|e| e.into_inner()).insert(pod_uid.to_string(), endpoint.to_string());
    }

    pub fn forget(&self, pod_uid: &str) {
        self.pods.lock().unwrap_or_else(|e| e.into_inner()).remove(pod_uid);
    }

    /// The name of the endpoint holding the pod's sandbox, if known.
    pub fn endpoint_name_of(&self, pod_uid: &str) -> Option<String> {
        self.pods.lock().unwrap_or_else(|e| e.into_inner()).get(pod_uid).cloned()
    }

    /// The endpoint holding the pod's sandbox, if known and still configured.
    pub fn endpoint_of(&self, pod_uid: &str) -> Option<Arc<Endpoint>> {
        self.endpoint(&self.endpoint_name_of(pod_uid)?)
    }

    /// Pod UIDs cached on `endpoint`.
    pub fn pods_on(&self, endpoint: &str) -> Vec<String> {
        let pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        let mut uids: Vec<String> = pods.iter().filter(|(_, e)| *e == endpoint).map(|(u, _)| u.clone()).collect();
        uids.sort();
        uids
    }

    /// Ticks whenever endpoints or their statuses change.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

/// How long one `Version` or `Status` call may take before the endpoint counts as unreachable.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The reason recorded when `Version` or `Status` cannot be called.
pub const REASON_UNREACHABLE: &str = "RuntimeUnreachable";

/// Reads `endpoint`'s `Version` and `Status`. Ready means `RuntimeReady` and (for `container`
/// endpoints) `NetworkReady` are true; the reason and message come from the first false
/// condition, or from the call's error ([`REASON_UNREACHABLE`]). When the runtime lists no
/// handlers, the endpoint's configured handlers and `""` are assumed. An unreachable runtime
/// keeps `last`'s name, version and handlers, so the Node still names it.
pub async fn probe(endpoint: &Endpoint, last: &EndpointStatus) -> EndpointStatus {
    let mut client = endpoint.runtime.clone();
    let unreachable = |call: &str, message: String| EndpointStatus {
        ready: false,
        reason: REASON_UNREACHABLE.into(),
        message: format!("CRI {call} on {} failed: {message}", endpoint.address),
        ..last.clone()
    };
    let version = tokio::time::timeout(PROBE_TIMEOUT, client.version(cri::VersionRequest { version: "v1".into() }));
    let version = match version.await {
        Err(_) => return unreachable("Version", format!("no answer within {PROBE_TIMEOUT:?}")),
        Ok(Err(status)) => return unreachable("Version", grpc_error_text(&status)),
        Ok(Ok(response)) => response.into_inner(),
    };
    let status = tokio::time::timeout(PROBE_TIMEOUT, client.status(cri::StatusRequest { verbose: false }));
    let status = match status.await {
        Err(_) => return unreachable("Status", format!("no answer within {PROBE_TIMEOUT:?}")),
        Ok(Err(status)) => return unreachable("Status", grpc_error_text(&status)),
        Ok(Ok(response)) => response.into_inner(),
    };
    status_from(&endpoint.workload_type, &endpoint.configured_handlers, version, status)
}

/// [`probe`]'s reading of a successful `Version` and `Status`.
fn status_from(
    workload_type: &str,
    configured_handlers: &[String],
    version: cri::VersionResponse,
    status: cri::StatusResponse,
) -> EndpointStatus {
    let conditions = status.status.map(|s| s.conditions).unwrap_or_default();
    let mut required = vec!["RuntimeReady"];
    if workload_type == crate::config::CONTAINER {
        required.push("NetworkReady");
    }
    let mut ready = true;
    let (mut reason, mut message) = (String::new(), String::new());
    for kind in required {
        let (ok, why, text) = match conditions.iter().find(|c| c.r#type == kind) {
            Some(c) if c.status => (true, String::new(), String::new()),
            Some(c) => {
                let why = if c.reason.is_empty() { format!("{kind}False") } else { c.reason.clone() };
                let text = if c.message.is_empty() { format!("{kind}=false") } else { c.message.clone() };
                (false, why, text)
            }
            None => (false, format!("{kind}Missing"), format!("the runtime's Status has no {kind} condition")),
        };
        if !ok && ready {
            ready = false;
            (reason, message) = (why, text);
        }
    }
    let (handlers, handler_features) = if status.runtime_handlers.is_empty() {
        let handlers = std::iter::once(String::new()).chain(configured_handlers.iter().cloned()).collect();
        (handlers, BTreeMap::new())
    } else {
        let features = status
            .runtime_handlers
            .iter()
            .map(|h| {
                let f = h.features.unwrap_or_default();
                let features = HandlerFeatures {
                    recursive_read_only_mounts: f.recursive_read_only_mounts,
                    user_namespaces: f.user_namespaces,
                };
                (h.name.clone(), features)
            })
            .collect();
        (status.runtime_handlers.into_iter().map(|h| h.name).collect(), features)
    };
    EndpointStatus {
        ready,
        reason,
        message,
        handlers,
        runtime_name: version.runtime_name,
        runtime_version: version.runtime_version,
        handler_features,
    }
}

/// A gRPC error with its causes (a connect error's `No such file or directory` is in a source).
fn grpc_error_text(status: &tonic::Status) -> String {
    let mut text = format!("{:?}: {}", status.code(), status.message());
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

fn serves(status: &EndpointStatus, handler: &str) -> bool {
    status.handlers.iter().any(|h| h == handler)
}

fn named_handlers(status: &EndpointStatus) -> Vec<String> {
    status.handlers.iter().filter(|h| !h.is_empty()).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(name: &str) -> Endpoint {
        Endpoint::connect_lazy("container", name, &format!("unix:///run/{name}.sock"), "").unwrap()
    }

    fn ready(handlers: &[&str]) -> EndpointStatus {
        EndpointStatus { ready: true, handlers: handlers.iter().map(|h| h.to_string()).collect(), ..Default::default() }
    }

    fn manager() -> RuntimeManager {
        let m = RuntimeManager::new("node-a");
        m.set_endpoints(vec![endpoint("berth"), endpoint("containerd")]);
        m.update_status("berth", ready(&["", "runc", "crun", "gvisor"]));
        m.update_status("containerd", ready(&["", "runc"]));
        m
    }

    #[tokio::test]
    async fn a_handler_goes_to_the_first_ready_endpoint_serving_it() {
        let m = manager();
        assert_eq!(m.select("gvisor", None).unwrap().name, "berth");
        assert_eq!(m.select("runc", None).unwrap().name, "berth");
        assert_eq!(m.select("", None).unwrap().name, "berth");
        m.update_status("berth", EndpointStatus { ready: false, ..ready(&["", "runc"]) });
        assert_eq!(m.select("runc", None).unwrap().name, "containerd");
    }

    #[tokio::test]
    async fn a_pin_selects_its_endpoint_or_fails_when_it_lacks_the_handler() {
        let m = manager();
        assert_eq!(m.select("runc", Some("containerd")).unwrap().name, "containerd");
        let err = m.select("gvisor", Some("containerd")).unwrap_err();
        assert!(matches!(err, SelectError::PinnedWithoutHandler { .. }), "{err}");
        assert!(matches!(m.select("runc", Some("nope")), Err(SelectError::UnknownEndpoint { .. })));
    }

    #[tokio::test]
    async fn an_unserved_handler_names_the_node_and_the_available_ones() {
        let m = manager();
        let err = m.select("kata", None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "runtime handler \"kata\" is not served by any runtime on node node-a (available: crun, gvisor, runc)"
        );
        assert_eq!(err.reason(), "RuntimeHandlerNotFound");
    }

    #[tokio::test]
    async fn removing_an_endpoint_reports_it_and_keeps_the_others_status() {
        let m = manager();
        let removed = m.set_endpoints(vec![endpoint("berth")]);
        assert_eq!(removed, vec!["containerd".to_string()]);
        assert!(m.endpoints()[0].1.ready, "berth kept its status");
        assert!(m.select("runc", Some("containerd")).is_err());
    }

    #[tokio::test]
    async fn an_endpoint_removed_with_pods_on_it_is_reported_until_they_are_forgotten() {
        let m = manager();
        m.remember("uid-1", "containerd");
        m.remember("uid-2", "berth");
        assert_eq!(m.set_endpoints(vec![endpoint("berth")]), vec!["containerd".to_string()]);
        let removed = m.removed_with_pods();
        assert_eq!(removed.len(), 1);
        assert_eq!(removed[0].name, "containerd");
        assert_eq!(removed[0].address, "unix:///run/containerd.sock");
        assert_eq!(removed[0].pods, vec!["uid-1".to_string()]);
        m.forget("uid-1");
        assert!(m.removed_with_pods().is_empty());
    }

    #[tokio::test]
    async fn an_endpoint_added_back_is_no_longer_reported_removed() {
        let m = manager();
        m.remember("uid-1", "containerd");
        m.set_endpoints(vec![endpoint("berth")]);
        m.set_endpoints(vec![endpoint("berth"), endpoint("containerd")]);
        assert!(m.removed_with_pods().is_empty());
    }

    #[tokio::test]
    async fn changed_configured_handlers_keep_the_status_but_take_the_new_endpoint() {
        let m = manager();
        let with_handlers = endpoint("containerd").with_configured_handlers(vec!["kata".into()]);
        m.set_endpoints(vec![endpoint("berth"), with_handlers]);
        let (containerd, status) = m.endpoints().into_iter().nth(1).unwrap();
        assert!(status.ready);
        assert_eq!(containerd.configured_handlers, vec!["kata".to_string()]);
    }

    #[tokio::test]
    async fn a_status_probed_from_a_replaced_endpoint_is_dropped() {
        let m = manager();
        let old = m.endpoint("containerd").unwrap();
        let moved = Endpoint::connect_lazy("container", "containerd", "unix:///run/other.sock", "").unwrap();
        m.set_endpoints(vec![endpoint("berth"), moved]);
        m.update_status_of(&old, ready(&["", "runc"]));
        assert!(!m.endpoints()[1].1.ready, "the old socket's status does not apply to the new one");
    }

    #[tokio::test]
    async fn usable_handlers_list_ready_endpoints_in_order_each_once_with_the_default() {
        let m = manager();
        let names: Vec<String> = m.usable_handlers().into_iter().map(|(h, _)| h).collect();
        assert_eq!(names, ["", "runc", "crun", "gvisor"]);
        m.update_status("berth", EndpointStatus { ready: false, ..ready(&["", "runc", "crun", "gvisor"]) });
        let names: Vec<String> = m.usable_handlers().into_iter().map(|(h, _)| h).collect();
        assert_eq!(names, ["", "runc"]);
    }

    fn condition(kind: &str, ok: bool, reason: &str, message: &str) -> cri::RuntimeCondition {
        cri::RuntimeCondition { r#type: kind.into(), status: ok, reason: reason.into(), message: message.into() }
    }

    fn version() -> cri::VersionResponse {
        cri::VersionResponse {
            runtime_name: "containerd".into(),
            runtime_version: "1.6.20".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_runtime_listing_no_handlers_serves_the_configured_ones_and_the_default() {
        let status = cri::StatusResponse {
            status: Some(cri::RuntimeStatus {
                conditions: vec![condition("RuntimeReady", true, "", ""), condition("NetworkReady", true, "", "")],
            }),
            ..Default::default()
        };
        let s = status_from("container", &["runc".into()], version(), status);
        assert!(s.ready);
        assert_eq!(s.handlers, ["", "runc"]);
        assert_eq!((s.runtime_name.as_str(), s.runtime_version.as_str()), ("containerd", "1.6.20"));
    }

    #[test]
    fn a_false_condition_gives_the_reason_and_message() {
        let status = cri::StatusResponse {
            status: Some(cri::RuntimeStatus {
                conditions: vec![
                    condition("RuntimeReady", true, "", ""),
                    condition("NetworkReady", false, "NetworkPluginNotReady", "cni plugin not initialized"),
                ],
            }),
            runtime_handlers: vec![cri::RuntimeHandler {
                name: "runc".into(),
                features: Some(cri::RuntimeHandlerFeatures {
                    recursive_read_only_mounts: true,
                    user_namespaces: false,
                }),
            }],
            ..Default::default()
        };
        let s = status_from("container", &["ignored".into()], version(), status);
        assert!(!s.ready);
        assert_eq!(s.reason, "NetworkPluginNotReady");
        assert_eq!(s.message, "cni plugin not initialized");
        assert_eq!(s.handlers, ["runc"], "the runtime's list wins over the configured one");
        assert!(s.handler_features["runc"].recursive_read_only_mounts);
        let missing = status_from("container", &[], version(), cri::StatusResponse::default());
        assert_eq!(missing.reason, "RuntimeReadyMissing");
    }

    #[tokio::test]
    async fn an_unreachable_runtime_is_not_ready_naming_the_socket_and_keeps_its_last_version() {
        let dir = tempfile::tempdir().unwrap();
        let address = format!("unix://{}", dir.path().join("none.sock").display());
        let e = Endpoint::connect_lazy("container", "berth", &address, "").unwrap();
        let last = EndpointStatus { runtime_name: "berth".into(), runtime_version: "0.1.0".into(), ..ready(&["runc"]) };
        let s = probe(&e, &last).await;
        assert!(!s.ready);
        assert_eq!(s.reason, REASON_UNREACHABLE);
        assert!(s.message.starts_with(&format!("CRI Version on {address} failed: ")), "{}", s.message);
        assert!(s.message.contains("No such file or directory"), "{}", s.message);
        assert_eq!((s.runtime_name.as_str(), s.runtime_version.as_str()), ("berth", "0.1.0"));
    }

    #[tokio::test]
    async fn an_endpoint_counts_as_uninventoried_until_its_pods_are_listed_and_again_when_replaced() {
        let m = manager();
        let names = |m: &RuntimeManager| m.uninventoried().iter().map(|e| e.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&m), ["berth", "containerd"]);
        let berth = m.endpoint("berth").unwrap();
        m.mark_inventoried(&berth);
        assert_eq!(names(&m), ["containerd"]);
        m.set_endpoints(vec![endpoint("berth"), endpoint("containerd")]);
        assert_eq!(names(&m), ["containerd"], "an endpoint that stays keeps its inventory");
        m.set_endpoints(vec![Endpoint::connect_lazy("container", "berth", "unix:///elsewhere.sock", "").unwrap()]);
        assert_eq!(names(&m), ["berth"], "another socket under the same name is a new runtime");
        m.mark_inventoried(&berth);
        assert_eq!(names(&m), ["berth"], "marking the replaced endpoint changes nothing");
    }

    #[tokio::test]
    async fn the_pod_cache_maps_pods_to_endpoints() {
        let m = manager();
        m.remember("uid-1", "containerd");
        assert_eq!(m.endpoint_of("uid-1").unwrap().name, "containerd");
        assert_eq!(m.pods_on("containerd"), vec!["uid-1".to_string()]);
        m.forget("uid-1");
        assert!(m.endpoint_of("uid-1").is_none());
    }
}
