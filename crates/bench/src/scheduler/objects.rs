//! The objects of a scheduler run as pure functions of their index: Nodes in three handler
//! mixes, ten zones and a few taints, the three RuntimeClasses, the pods of both cases, and the
//! check that a placement respects what those pods ask for.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use serde_json::json;

/// RuntimeClass name → handler; pod `i` of case 1 and group `g` of case 2 take class `i % 3`.
pub const CLASSES: [(&str, &str); 3] = [("runc", "runc"), ("crun", "crun"), ("gvisor", "runsc")];
/// Handlers node `i` reports in `status.runtimeHandlers`: mix `i % 3`.
pub const MIXES: [&[&str]; 3] = [&["runc", "crun", "runsc"], &["runc", "crun"], &["runc"]];
pub const ZONES: usize = 10;
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// The label that puts a case 2 pod in its group (one fake ReplicaSet).
pub const GROUP_LABEL: &str = "group";
/// Allocatable of every node.
pub const NODE_CPU: &str = "32";
pub const NODE_MEMORY: &str = "128Gi";
pub const NODE_PODS: usize = 110;
/// Requests of every pod.
pub const POD_CPU: &str = "100m";
pub const POD_MEMORY: &str = "128Mi";
/// Node names are `node-<index>` and pod names `p-<index>`.
const NODE_PREFIX: &str = "node-";
const POD_PREFIX: &str = "p-";

pub fn node_name(i: usize) -> String {
    format!("{NODE_PREFIX}{i:05}")
}

pub fn node_index(name: &str) -> Option<usize> {
    name.strip_prefix(NODE_PREFIX)?.parse().ok()
}

pub fn pod_name(i: usize) -> String {
    format!("{POD_PREFIX}{i:05}")
}

pub fn pod_index(name: &str) -> Option<usize> {
    name.strip_prefix(POD_PREFIX)?.parse().ok()
}

pub fn zone(node: usize) -> String {
    format!("zone-{}", node % ZONES)
}

pub fn mix(node: usize) -> &'static [&'static str] {
    MIXES[node % MIXES.len()]
}

/// One block of ten consecutive nodes in twenty (5 %) has a NoSchedule taint; a block spans
/// all zones and all mixes, so every (zone, mix) keeps untainted nodes.
pub fn tainted(node: usize) -> bool {
    (node / ZONES) % 20 == 3
}

/// Whether a pod of `handler` without tolerations may run on node `i`.
pub fn fits(node: usize, handler: &str) -> bool {
    !tainted(node) && mix(node).contains(&handler)
}

/// A Node as its agent would register it: labels, taint, allocatable, runtime handlers, Ready.
pub fn node(i: usize) -> Node {
    let name = node_name(i);
    let handlers: Vec<_> = mix(i).iter().map(|h| json!({"name": h, "features": {}})).collect();
    let resources =
        json!({"cpu": NODE_CPU, "memory": NODE_MEMORY, "pods": NODE_PODS.to_string(), "ephemeral-storage": "100Gi"});
    let taints = if tainted(i) {
        json!([{"key": "bench.berth.dev/reserved", "value": "true", "effect": "NoSchedule"}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            HOSTNAME_LABEL: name,
            ZONE_LABEL: zone(i),
            "topology.kubernetes.io/region": "bench",
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": "bench-32",
        }},
        "spec": {"taints": taints},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "runtimeHandlers": handlers,
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "berth-bench node"},
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure"},
                {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID"},
            ],
            "nodeInfo": {
                "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "6.1.0",
                "osImage": "berth-bench", "containerRuntimeVersion": "berth://bench",
                "kubeletVersion": "v1.33.0", "kubeProxyVersion": "", "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }))
    .expect("a valid Node")
}

/// Whether a Node as the server returned it kept what [`node`] put in its status.
pub fn status_kept(node: &Node) -> bool {
    let status = node.status.as_ref();
    status.and_then(|s| s.allocatable.as_ref()).is_some_and(|a| a.contains_key("pods"))
        && status.and_then(|s| s.runtime_handlers.as_ref()).is_some_and(|h| !h.is_empty())
        && status.and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready"))
}

pub fn runtime_classes() -> Vec<RuntimeClass> {
    CLASSES
        .iter()
        .map(|(name, handler)| {
            serde_json::from_value(json!({"metadata": {"name": name}, "handler": handler})).expect("a RuntimeClass")
        })
        .collect()
}

/// The class of case 1's pod `i`.
pub fn basic_class(i: usize) -> usize {
    i % CLASSES.len()
}

/// What case 2's group `g` asks for: required anti-affinity on the hostname (even groups) or a
/// hard topology spread over zones (odd groups).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Constraint {
    AntiAffinity,
    Spread,
}

pub fn group_constraint(g: usize) -> Constraint {
    if g.is_multiple_of(2) { Constraint::AntiAffinity } else { Constraint::Spread }
}

/// The class of case 2's group `g`.
pub fn group_class(g: usize) -> usize {
    g % CLASSES.len()
}

fn group_name(g: usize) -> String {
    format!("group-{g:03}")
}

/// A pod of case 1: requests and a RuntimeClass, no other constraint.
pub fn basic_pod(i: usize, scheduler_name: Option<&str>) -> Pod {
    let (class, _) = CLASSES[basic_class(i)];
    let mut pod = pod_json(&pod_name(i), class, json!({"app": "berth-bench", "class": class}));
    if let Some(name) = scheduler_name {
        pod["spec"]["schedulerName"] = json!(name);
    }
    serde_json::from_value(pod).expect("a valid Pod")
}

/// Pod `i` of case 2, in group `i / group_size`, owned by that group's fake ReplicaSet (so the
/// scheduler's default spreading scores it too).
pub fn group_pod(i: usize, group_size: usize) -> Pod {
    let g = i / group_size;
    let (class, _) = CLASSES[group_class(g)];
    let group = group_name(g);
    let mut pod = pod_json(&pod_name(i), class, json!({"app": "berth-bench", GROUP_LABEL: group}));
    pod["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": group,
        "uid": format!("00000000-0000-4000-8000-{g:012}"), "controller": true, "blockOwnerDeletion": true,
    }]);
    let selector = json!({"matchLabels": {GROUP_LABEL: group}});
    match group_constraint(g) {
        Constraint::AntiAffinity => {
            pod["spec"]["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": selector, "topologyKey": HOSTNAME_LABEL}
            ]}});
        }
        Constraint::Spread => {
            pod["spec"]["topologySpreadConstraints"] = json!([{
                "maxSkew": 1, "topologyKey": ZONE_LABEL, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": selector,
            }]);
        }
    }
    serde_json::from_value(pod).expect("a valid Pod")
}

fn pod_json(name: &str, class: &str, labels: serde_json::Value) -> serde_json::Value {
    json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "runtimeClassName": class,
            "containers": [{
                "name": "app",
                "image": "registry.example/berth-bench/app:1.0",
                "resources": {"requests": {"cpu": POD_CPU, "memory": POD_MEMORY}},
            }],
        },
    })
}

/// The pods of a run and what their placement must respect.
#[derive(Clone, Copy, Debug)]
pub enum Workload {
    /// Case 1: `pods` pods of the three classes.
    Basic { pods: usize },
    /// Case 2: `pods` pods in groups of `group_size`.
    Groups { pods: usize, group_size: usize },
}

impl Workload {
    pub fn pods(&self) -> usize {
        match *self {
            Workload::Basic { pods } | Workload::Groups { pods, .. } => pods,
        }
    }

    pub fn pod(&self, i: usize) -> Pod {
        match *self {
            Workload::Basic { .. } => basic_pod(i, None),
            Workload::Groups { group_size, .. } => group_pod(i, group_size),
        }
    }

    fn handler(&self, i: usize) -> &'static str {
        let class = match *self {
            Workload::Basic { .. } => basic_class(i),
            Workload::Groups { group_size, .. } => group_class(i / group_size),
        };
        CLASSES[class].1
    }

    /// Why these pods could not all fit on `nodes` nodes, if they could not: each class needs
    /// room on its untainted nodes, and an anti-affinity group as many distinct such nodes.
    pub fn unfit(&self, nodes: usize) -> Option<String> {
        if nodes < 3 * ZONES {
            return Some(format!(
                "{nodes} nodes do not cover every zone with every handler mix (at least {})",
                3 * ZONES
            ));
        }
        let total_room = (0..nodes).filter(|&n| !tainted(n)).count() * NODE_PODS;
        if self.pods() > total_room {
            return Some(format!("{} pods exceed the {total_room} pod slots of the untainted nodes", self.pods()));
        }
        for (class, (name, handler)) in CLASSES.iter().enumerate() {
            let eligible = (0..nodes).filter(|&n| fits(n, handler)).count();
            let pods = (0..self.pods()).filter(|&i| self.handler(i) == *handler).count();
            if pods > eligible * NODE_PODS {
                return Some(format!("{pods} {name} pods exceed the room of its {eligible} nodes"));
            }
            if let Workload::Groups { group_size, .. } = *self
                && (0..self.pods().div_ceil(group_size))
                    .any(|g| group_class(g) == class && group_constraint(g) == Constraint::AntiAffinity)
                && group_size > eligible
            {
                return Some(format!(
                    "anti-affinity groups of {group_size} {name} pods need as many of its {eligible} nodes"
                ));
            }
        }
        None
    }

    /// Every way the placement `pod index → node name` breaks what the pods ask for: a node
    /// that does not exist, is tainted or lacks the handler; two pods of an anti-affinity group
    /// on one node; a spread group whose zones differ by more than one pod. Empty: all good.
    pub fn violations(&self, placement: &HashMap<usize, String>, nodes: usize) -> Vec<String> {
        let mut out = Vec::new();
        let mut by_group: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (&i, node) in placement {
            let Some(n) = node_index(node).filter(|&n| n < nodes) else {
                out.push(format!("{} is on {node:?}, not a bench node", pod_name(i)));
                continue;
            };
            let handler = self.handler(i);
            if !mix(n).contains(&handler) {
                out.push(format!(
                    "{} needs handler {handler} but is on {node}, which reports {:?}",
                    pod_name(i),
                    mix(n)
                ));
            }
            if tainted(n) {
                out.push(format!("{} has no toleration but is on {node}, which is tainted NoSchedule", pod_name(i)));
            }
            if let Workload::Groups { group_size, .. } = *self {
                by_group.entry(i / group_size).or_default().push(n);
            }
        }
        for (g, members) in by_group {
            match group_constraint(g) {
                Constraint::AntiAffinity => {
                    let distinct: HashSet<usize> = members.iter().copied().collect();
                    if distinct.len() != members.len() {
                        out.push(format!(
                            "anti-affinity group {g}: {} pods on only {} nodes",
                            members.len(),
                            distinct.len()
                        ));
                    }
                }
                Constraint::Spread => {
                    let mut per_zone = [0usize; ZONES];
                    for n in &members {
                        per_zone[n % ZONES] += 1;
                    }
                    let (min, max) = (per_zone.iter().min(), per_zone.iter().max());
                    if let (Some(min), Some(max)) = (min, max)
                        && max - min > 1
                    {
                        out.push(format!("spread group {g}: pods per zone {per_zone:?}, skew {} > 1", max - min));
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_zone_has_every_handler_mix_untainted_and_five_percent_of_nodes_are_tainted() {
        let nodes = 1000;
        for z in 0..ZONES {
            for m in 0..MIXES.len() {
                assert!((0..nodes).any(|n| n % ZONES == z && n % 3 == m && !tainted(n)), "zone {z} mix {m}");
            }
        }
        assert_eq!((0..nodes).filter(|&n| tainted(n)).count(), 50);
        assert_eq!((0..5000).filter(|&n| fits(n, "runsc")).count(), 1583);
    }

    #[test]
    fn nodes_and_pods_parse_as_the_server_will_see_them() {
        let n = node(30);
        assert!(status_kept(&n));
        assert_eq!(n.spec.unwrap().taints.unwrap().len(), 1);
        assert_eq!(node_index(&node_name(4321)), Some(4321));
        let p = basic_pod(2, Some("none"));
        assert_eq!(p.spec.as_ref().unwrap().runtime_class_name.as_deref(), Some("gvisor"));
        assert_eq!(p.spec.unwrap().scheduler_name.as_deref(), Some("none"));
        assert_eq!(pod_index(&pod_name(17)), Some(17));
        let anti = group_pod(5, 100);
        assert!(anti.spec.unwrap().affinity.unwrap().pod_anti_affinity.is_some());
        let spread = group_pod(150, 100);
        assert_eq!(spread.spec.unwrap().topology_spread_constraints.unwrap()[0].max_skew, 1);
    }

    #[test]
    fn the_default_sizes_fit_and_too_few_nodes_are_refused() {
        assert_eq!(Workload::Basic { pods: 10_000 }.unfit(5000), None);
        assert_eq!(Workload::Groups { pods: 5000, group_size: 100 }.unfit(1000), None);
        assert!(Workload::Basic { pods: 10 }.unfit(20).is_some());
        assert!(Workload::Groups { pods: 5000, group_size: 500 }.unfit(1000).is_some());
    }

    #[test]
    fn placements_that_break_a_constraint_are_reported() {
        let basic = Workload::Basic { pods: 3 };
        // Pod 2 is gvisor: node 1 reports [runc, crun] only.
        let bad: HashMap<usize, String> = [(0, node_name(0)), (1, node_name(0)), (2, node_name(1))].into();
        let v = basic.violations(&bad, 100);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("runsc"));
        let tainted_node = (0..100).find(|&n| tainted(n)).unwrap();
        assert_eq!(basic.violations(&[(0, node_name(tainted_node))].into(), 100).len(), 1);

        let groups = Workload::Groups { pods: 4, group_size: 2 };
        // Group 0 (anti-affinity, runc) twice on node 0; group 1 (spread, crun) twice in zone 0.
        let p: HashMap<usize, String> =
            [(0, node_name(0)), (1, node_name(0)), (2, node_name(0)), (3, node_name(10))].into();
        let v = groups.violations(&p, 100);
        assert_eq!(v.len(), 2, "{v:?}");
        let ok: HashMap<usize, String> =
            [(0, node_name(0)), (1, node_name(3)), (2, node_name(0)), (3, node_name(1))].into();
        assert!(groups.violations(&ok, 100).is_empty());
    }
}
