//! What the scheduler keeps of a node: its labels, taints, allocatable and runtime handlers from
//! the Node object, and the sums over the pods bound or assumed on it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use rustc_hash::FxHashMap;

use k8s_openapi::api::core::v1 as core;

use crate::pod_info::{HostPort, PodInfo, normalized_image};
use crate::resources::{Resources, value};
use crate::taints::Taint;

/// The node's name label: default topology spreading counts pods per node by it.
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
/// The node's zone label: default topology spreading counts pods per zone by it.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";

/// Kubernetes' default `maxPods` of a kubelet, for nodes that report no `pods` allocatable.
const DEFAULT_ALLOWED_PODS: i64 = 110;

/// The parts of a Node object the scheduler reads.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeSpec {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub allocatable: Resources,
    pub allowed_pods: i64,
    /// Handlers the node reports it can run now; `None` when it reports none at all (a kubelet
    /// that predates the field), which counts as every handler.
    pub runtime_handlers: Option<HashSet<String>>,
    /// Image name → size in bytes.
    pub images: HashMap<String, i64>,
}

impl NodeSpec {
    pub fn from_node(node: &core::Node) -> NodeSpec {
        let spec = node.spec.as_ref();
        let status = node.status.as_ref();
        let allocatable = status.and_then(|s| s.allocatable.as_ref().or(s.capacity.as_ref()));
        let mut images = HashMap::new();
        for image in status.and_then(|s| s.images.as_ref()).into_iter().flatten() {
            for name in image.names.iter().flatten() {
                images.insert(normalized_image(name), image.size_bytes.unwrap_or(0));
            }
        }
        NodeSpec {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: spec.and_then(|s| s.taints.as_ref()).into_iter().flatten().filter_map(Taint::from_k8s).collect(),
            unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
            allocatable: Resources::from_list(allocatable),
            allowed_pods: allocatable.and_then(|a| a.get("pods")).map_or(DEFAULT_ALLOWED_PODS, value),
            runtime_handlers: status
                .and_then(|s| s.runtime_handlers.as_ref())
                .map(|hs| hs.iter().map(|h| h.name.clone().unwrap_or_default()).collect()),
            images,
        }
    }

    pub fn supports_handler(&self, handler: &str) -> bool {
        self.runtime_handlers.as_ref().is_none_or(|hs| hs.contains(handler))
    }
}

/// A node with the pods on it.
#[derive(Clone, Debug, Default)]
pub struct NodeInfo {
    pub node: NodeSpec,
    pub pods: Vec<Arc<PodInfo>>,
    pub requested: Resources,
    pub non_zero_requested: Resources,
    pub used_ports: Vec<HostPort>,
    /// Pods on the node with any (anti-)affinity term, and with a required anti-affinity term:
    /// lets inter-pod affinity skip nodes that have none.
    pub pods_with_affinity: usize,
    pub pods_with_required_anti_affinity: usize,
    /// The node's handlers as bits of the cache's handler numbering (see
    /// [`crate::framework::Snapshot::handler_bits`]); `None` when it reports none at all (every
    /// handler) or names one that has no bit.
    pub handler_mask: Option<u64>,
    /// Pods on the node that are not terminating, per controlling owner's UID: the default
    /// spreading constraints count these on every node for every controlled pod scheduled, so
    /// a lookup here replaces a pass over the node's pods.
    pub controller_pods: FxHashMap<String, u32>,
    /// The node's [`LABEL_HOSTNAME`] and [`LABEL_ZONE`] values, read for every pod that spreads
    /// (every controlled pod): kept beside the node's other hot fields, the zone shared with
    /// every node of the zone, because a label map lookup on each of thousands of nodes per pod
    /// waited on memory more than anything else the scheduler does.
    hostname: Option<Arc<str>>,
    zone: Option<Arc<str>>,
}

impl NodeInfo {
    pub fn new(node: NodeSpec) -> NodeInfo {
        let mut info = NodeInfo::default();
        info.set_node(node);
        info
    }

    /// Replaces what the node object says, keeping the pods.
    pub fn set_node(&mut self, node: NodeSpec) {
        self.hostname = node.labels.get(LABEL_HOSTNAME).map(|h| Arc::from(h.as_str()));
        self.zone = node.labels.get(LABEL_ZONE).map(|z| interned(z));
        self.node = node;
    }

    /// The node's value for a topology key (a label), found without a label lookup for the
    /// hostname and zone keys.
    pub fn topology_value(&self, key: &str) -> Option<&str> {
        match key {
            LABEL_HOSTNAME => self.hostname.as_deref(),
            LABEL_ZONE => self.zone.as_deref(),
            _ => self.node.labels.get(key).map(String::as_str),
        }
    }

    pub fn name(&self) -> &str {
        &self.node.name
    }

    pub fn add_pod(&mut self, pod: Arc<PodInfo>) {
        self.requested.add(&pod.requests);
        self.non_zero_requested.add(&pod.non_zero_requests);
        self.used_ports.extend(pod.host_ports.iter().cloned());
        self.pods_with_affinity += usize::from(pod.has_affinity());
        self.pods_with_required_anti_affinity += usize::from(pod.has_required_anti_affinity());
        if let Some(owner) = pod.controller_uid.as_ref().filter(|_| !pod.terminating) {
            *self.controller_pods.entry(owner.clone()).or_default() += 1;
        }
        self.pods.push(pod);
    }

    /// Non-terminating pods on the node controlled by `owner`.
    pub fn pods_of_controller(&self, owner: &str) -> u32 {
        self.controller_pods.get(owner).copied().unwrap_or(0)
    }

    /// Removes the pod with this UID; false if it was not here.
    pub fn remove_pod(&mut self, uid: &str) -> bool {
        let Some(i) = self.pods.iter().position(|p| p.uid == uid) else { return false };
        let pod = self.pods.swap_remove(i);
        self.requested.sub(&pod.requests);
        self.non_zero_requested.sub(&pod.non_zero_requests);
        for port in &pod.host_ports {
            if let Some(j) = self.used_ports.iter().position(|p| p == port) {
                self.used_ports.swap_remove(j);
            }
        }
        self.pods_with_affinity -= usize::from(pod.has_affinity());
        self.pods_with_required_anti_affinity -= usize::from(pod.has_required_anti_affinity());
        if let Some(owner) = pod.controller_uid.as_ref().filter(|_| !pod.terminating)
            && let Some(n) = self.controller_pods.get_mut(owner)
        {
            *n -= 1;
            if *n == 0 {
                self.controller_pods.remove(owner);
            }
        }
        true
    }
}

/// One shared copy of each zone name: a cluster has a handful, and every node of a zone then
/// points at the same bytes, which stay in cache.
fn interned(zone: &str) -> Arc<str> {
    static ZONES: OnceLock<Mutex<HashSet<Arc<str>>>> = OnceLock::new();
    let mut zones = ZONES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(z) = zones.get(zone) {
        return z.clone();
    }
    let z: Arc<str> = Arc::from(zone);
    zones.insert(z.clone());
    z
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(json: serde_json::Value) -> NodeSpec {
        NodeSpec::from_node(&serde_json::from_value(json).unwrap())
    }

    #[test]
    fn a_node_is_parsed_into_what_the_plugins_read() {
        let n = node(serde_json::json!({
            "metadata": {"name": "n1", "labels": {"zone": "a"}},
            "spec": {"unschedulable": true, "taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]},
            "status": {
                "allocatable": {"cpu": "2", "memory": "4Gi", "pods": "50"},
                "runtimeHandlers": [{"name": "runc"}, {"name": ""}],
                "images": [{"names": ["docker.io/library/nginx:1", "nginx"], "sizeBytes": 1000}]
            }
        }));
        assert_eq!(n.name, "n1");
        assert!(n.unschedulable);
        assert_eq!(n.taints.len(), 1);
        assert_eq!(n.allocatable.milli_cpu, 2000);
        assert_eq!(n.allocatable.memory, 4 << 30);
        assert_eq!(n.allowed_pods, 50);
        assert!(n.supports_handler("runc") && n.supports_handler(""));
        assert!(!n.supports_handler("gvisor"));
        assert_eq!(n.images.get("nginx:latest"), Some(&1000));
    }

    #[test]
    fn a_node_without_runtime_handlers_supports_every_handler_and_110_pods() {
        let n = node(serde_json::json!({"metadata": {"name": "n"}, "status": {"capacity": {"cpu": "1"}}}));
        assert!(n.supports_handler("gvisor"));
        assert_eq!(n.allowed_pods, 110);
        assert_eq!(n.allocatable.milli_cpu, 1000);
    }

    #[test]
    fn pods_of_a_controller_are_counted_per_node_without_the_terminating_ones() {
        let mut info = NodeInfo::new(NodeSpec::default());
        let pod = |uid: &str, owner: Option<&str>, terminating: bool| {
            Arc::new(PodInfo {
                uid: uid.into(),
                controller_uid: owner.map(str::to_string),
                terminating,
                ..Default::default()
            })
        };
        info.add_pod(pod("a", Some("rs1"), false));
        info.add_pod(pod("b", Some("rs1"), false));
        info.add_pod(pod("c", Some("rs1"), true));
        info.add_pod(pod("d", Some("rs2"), false));
        info.add_pod(pod("e", None, false));
        assert_eq!((info.pods_of_controller("rs1"), info.pods_of_controller("rs2")), (2, 1));
        info.remove_pod("a");
        info.remove_pod("c");
        info.remove_pod("d");
        assert_eq!((info.pods_of_controller("rs1"), info.pods_of_controller("rs2")), (1, 0));
        assert_eq!(info.controller_pods.len(), 1, "an owner without pods here leaves no entry");
    }

    #[test]
    fn topology_values_follow_the_node_labels_and_nodes_of_a_zone_share_its_name() {
        let labelled = |name: &str, zone: Option<&str>| {
            let mut labels = serde_json::json!({LABEL_HOSTNAME: name, "rack": "r1"});
            if let Some(z) = zone {
                labels[LABEL_ZONE] = z.into();
            }
            NodeInfo::new(node(serde_json::json!({"metadata": {"name": name, "labels": labels}})))
        };
        let (a, b) = (labelled("a", Some("z1")), labelled("b", Some("z1")));
        assert_eq!((a.topology_value(LABEL_HOSTNAME), a.topology_value(LABEL_ZONE)), (Some("a"), Some("z1")));
        assert_eq!(a.topology_value("rack"), Some("r1"));
        assert_eq!(a.topology_value("row"), None);
        assert!(Arc::ptr_eq(a.zone.as_ref().unwrap(), b.zone.as_ref().unwrap()), "one copy of a zone's name");

        let mut moved = labelled("c", None);
        assert_eq!(moved.topology_value(LABEL_ZONE), None);
        moved.set_node(labelled("c", Some("z2")).node);
        assert_eq!(moved.topology_value(LABEL_ZONE), Some("z2"), "an updated node's zone is read again");
    }

    #[test]
    fn pods_add_and_remove_their_requests_and_ports() {
        let mut info = NodeInfo::new(NodeSpec::default());
        let pod = Arc::new(PodInfo {
            uid: "u".into(),
            requests: Resources { milli_cpu: 100, memory: 10, ephemeral_storage: 0 },
            host_ports: vec![HostPort { ip: "0.0.0.0".into(), protocol: "TCP".into(), port: 80 }],
            ..Default::default()
        });
        info.add_pod(pod);
        assert_eq!(info.requested.milli_cpu, 100);
        assert_eq!(info.used_ports.len(), 1);
        assert!(info.remove_pod("u"));
        assert!(!info.remove_pod("u"));
        assert!(info.requested.is_zero() && info.used_ports.is_empty() && info.pods.is_empty());
    }
}
