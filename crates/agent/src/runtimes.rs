//! The runtime manager (seed `002_…`'s `RuntimeManager`): which CRI endpoint serves which pod.
//!
//! Endpoints keep their configured order; the first endpoint of a workload type is its default.
//! Each endpoint's last CRI `Status` says whether it is ready and which handlers it serves; a pod's
//! handler selects the first ready endpoint serving it, unless the pod pins an endpoint by name.
//! The pod→endpoint cache remembers where each pod's sandbox lives, so later calls (stop, exec,
//! logs) go to the same runtime even if the configuration changed meanwhile.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

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
}

/// The endpoints of this node, their last status, and the pod→endpoint cache.
pub struct RuntimeManager {
    node_name: String,
    entries: RwLock<Vec<Entry>>,
    /// Pod UID → endpoint name.
    pods: Mutex<HashMap<String, String>>,
    /// Bumped whenever endpoints or their statuses change, so pods waiting for a handler retry.
    changes: tokio::sync::watch::Sender<u64>,
}

impl RuntimeManager {
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            entries: RwLock::new(Vec::new()),
            pods: Mutex::new(HashMap::new()),
            changes: tokio::sync::watch::channel(0).0,
        }
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Replaces the configured endpoints, keeping the last status of endpoints that stay (same
    /// name and address). Returns the names of endpoints that went away.
    pub fn set_endpoints(&self, endpoints: Vec<Endpoint>) -> Vec<String> {
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        let mut old: Vec<Entry> = std::mem::take(&mut *entries);
        for endpoint in endpoints {
            let kept =
                old.iter().position(|e| e.endpoint.name == endpoint.name && e.endpoint.address == endpoint.address);
            let entry = match kept {
                Some(i) => old.remove(i),
                None => Entry { endpoint: Arc::new(endpoint), status: EndpointStatus::default() },
            };
            entries.push(entry);
        }
        drop(entries);
        self.changes.send_modify(|n| *n += 1);
        old.into_iter().map(|e| e.endpoint.name.clone()).filter(|name| self.endpoint(name).is_none()).collect()
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
    async fn the_pod_cache_maps_pods_to_endpoints() {
        let m = manager();
        m.remember("uid-1", "containerd");
        assert_eq!(m.endpoint_of("uid-1").unwrap().name, "containerd");
        assert_eq!(m.pods_on("containerd"), vec!["uid-1".to_string()]);
        m.forget("uid-1");
        assert!(m.endpoint_of("uid-1").is_none());
    }
}
