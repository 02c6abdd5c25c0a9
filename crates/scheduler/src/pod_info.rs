//! What the scheduler keeps of a pod: parsed once from the API object into the few fields the
//! plugins read (requests, ports, affinity, tolerations, spread constraints), so a decision never
//! re-parses a pod and the cache does not hold whole objects.

use std::collections::BTreeMap;

use berth_api::selector::LabelSelector;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;

use crate::node_selector::{NodeSelector, NodeSelectorTerm};
use crate::resources::{Resources, pod_requests};
use crate::taints::Toleration;

/// The scheduler name pods get by default.
pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";

/// A `hostPort` a pod takes on its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPort {
    /// `0.0.0.0` when unset, which conflicts with every address.
    pub ip: String,
    pub protocol: String,
    pub port: i32,
}

impl HostPort {
    pub fn conflicts(&self, other: &HostPort) -> bool {
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip == other.ip || self.ip == "0.0.0.0" || other.ip == "0.0.0.0")
    }
}

/// Which pods a term or constraint counts.
#[derive(Clone, Debug, PartialEq)]
pub enum PodMatcher {
    /// A null label selector selects no pod.
    Nothing,
    Labels(LabelSelector),
    /// Pods of one controller (ReplicaSet, StatefulSet, ...): the default spreading constraints
    /// count these, as Kubernetes counts the pods its owner's selector matches.
    Controller(String),
}

impl PodMatcher {
    fn from_selector(sel: Option<&meta::LabelSelector>) -> PodMatcher {
        match sel.map(LabelSelector::from_k8s) {
            Some(Ok(s)) => PodMatcher::Labels(s),
            _ => PodMatcher::Nothing,
        }
    }

    pub fn matches(&self, pod: &PodInfo) -> bool {
        match self {
            PodMatcher::Nothing => false,
            PodMatcher::Labels(s) => s.matches(&pod.labels),
            PodMatcher::Controller(uid) => pod.controller_uid.as_deref() == Some(uid.as_str()),
        }
    }
}

/// One pod (anti-)affinity term, with its namespaces resolved as Kubernetes does: no namespaces
/// and no namespace selector mean the pod's own namespace.
#[derive(Clone, Debug, PartialEq)]
pub struct AffinityTerm {
    pub selector: PodMatcher,
    pub namespaces: Vec<String>,
    /// `None` selects no namespace; an empty selector selects every namespace.
    pub namespace_selector: Option<LabelSelector>,
    pub topology_key: String,
}

impl AffinityTerm {
    fn parse(t: &core::PodAffinityTerm, own_namespace: &str) -> AffinityTerm {
        let namespace_selector = t.namespace_selector.as_ref().and_then(|s| LabelSelector::from_k8s(s).ok());
        let mut namespaces = t.namespaces.clone().unwrap_or_default();
        if namespaces.is_empty() && t.namespace_selector.is_none() {
            namespaces.push(own_namespace.to_string());
        }
        AffinityTerm {
            selector: PodMatcher::from_selector(t.label_selector.as_ref()),
            namespaces,
            namespace_selector,
            topology_key: t.topology_key.clone(),
        }
    }

    /// Whether `pod` is one of the pods this term selects; `namespace_labels` are the labels
    /// of the pod's namespace, when known.
    pub fn matches(&self, pod: &PodInfo, namespace_labels: Option<&BTreeMap<String, String>>) -> bool {
        let in_namespace = self.namespaces.contains(&pod.namespace)
            || self
                .namespace_selector
                .as_ref()
                .is_some_and(|s| s.is_empty() || namespace_labels.is_some_and(|labels| s.matches(labels)));
        in_namespace && self.selector.matches(pod)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct WeightedAffinityTerm {
    pub weight: i32,
    pub term: AffinityTerm,
}

/// One topology spread constraint of a pod (or a default one).
#[derive(Clone, Debug, PartialEq)]
pub struct SpreadConstraint {
    pub max_skew: i32,
    pub topology_key: String,
    /// `whenUnsatisfiable: DoNotSchedule` (a filter); else `ScheduleAnyway` (a score).
    pub hard: bool,
    pub selector: PodMatcher,
    pub min_domains: Option<i32>,
    /// `nodeAffinityPolicy: Honor` (the default): only nodes the pod's node affinity and
    /// selector allow count as domains.
    pub honor_node_affinity: bool,
    /// `nodeTaintsPolicy: Honor` (the default is Ignore): only nodes whose taints the pod
    /// tolerates count.
    pub honor_node_taints: bool,
}

impl SpreadConstraint {
    fn parse(c: &core::TopologySpreadConstraint, labels: &BTreeMap<String, String>) -> SpreadConstraint {
        let mut selector = c.label_selector.clone();
        // matchLabelKeys: the pod's own values of those keys narrow the selector.
        if let (Some(sel), Some(keys)) = (selector.as_mut(), c.match_label_keys.as_ref()) {
            for key in keys {
                if let Some(v) = labels.get(key) {
                    sel.match_labels.get_or_insert_with(Default::default).insert(key.clone(), v.clone());
                }
            }
        }
        SpreadConstraint {
            max_skew: c.max_skew,
            topology_key: c.topology_key.clone(),
            hard: c.when_unsatisfiable == "DoNotSchedule",
            selector: PodMatcher::from_selector(selector.as_ref()),
            min_domains: c.min_domains,
            honor_node_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
            honor_node_taints: c.node_taints_policy.as_deref() == Some("Honor"),
        }
    }
}

/// A pod as the scheduler sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodInfo {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub resource_version: String,
    pub labels: BTreeMap<String, String>,
    /// The node it is bound to; empty while pending.
    pub node_name: String,
    pub scheduler_name: String,
    pub priority: i32,
    pub requests: Resources,
    /// Requests with the scoring defaults for containers that name none.
    pub non_zero_requests: Resources,
    pub host_ports: Vec<HostPort>,
    pub node_selector: BTreeMap<String, String>,
    pub required_node_affinity: Option<NodeSelector>,
    pub preferred_node_affinity: Vec<(i32, NodeSelectorTerm)>,
    pub tolerations: Vec<Toleration>,
    pub required_affinity: Vec<AffinityTerm>,
    pub required_anti_affinity: Vec<AffinityTerm>,
    pub preferred_affinity: Vec<WeightedAffinityTerm>,
    pub preferred_anti_affinity: Vec<WeightedAffinityTerm>,
    /// The pod's own constraints; empty means the default ones apply (see `controller_uid`).
    pub spread_constraints: Vec<SpreadConstraint>,
    pub runtime_class: Option<String>,
    /// Names of its scheduling gates; a gated pod is not tried.
    pub scheduling_gates: Vec<String>,
    /// Container images, normalised as node status reports them (`:latest` added).
    pub images: Vec<String>,
    /// The UID of its controlling owner (a ReplicaSet, ...).
    pub controller_uid: Option<String>,
    pub terminating: bool,
    /// Succeeded or Failed: no longer takes resources.
    pub finished: bool,
    /// While pending: the message of its `PodScheduled=False` condition of reason
    /// `Unschedulable`, as a scheduler last reported it.
    pub reported_unschedulable: Option<String>,
}

impl PodInfo {
    pub fn from_pod(pod: &core::Pod) -> PodInfo {
        let meta = &pod.metadata;
        let namespace = meta.namespace.clone().unwrap_or_default();
        let labels = meta.labels.clone().unwrap_or_default();
        let empty = core::PodSpec::default();
        let spec = pod.spec.as_ref().unwrap_or(&empty);
        let (requests, non_zero_requests) = pod_requests(spec);
        let host_ports = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten().filter(|c| c.restart_policy.as_deref() == Some("Always")))
            .flat_map(|c| c.ports.iter().flatten())
            .filter(|p| p.host_port.is_some_and(|hp| hp > 0))
            .map(|p| HostPort {
                ip: p.host_ip.clone().filter(|ip| !ip.is_empty()).unwrap_or_else(|| "0.0.0.0".into()),
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                port: p.host_port.unwrap_or_default(),
            })
            .collect();
        let affinity = spec.affinity.as_ref();
        let node_affinity = affinity.and_then(|a| a.node_affinity.as_ref());
        let pod_affinity = affinity.and_then(|a| a.pod_affinity.as_ref());
        let pod_anti_affinity = affinity.and_then(|a| a.pod_anti_affinity.as_ref());
        let terms = |ts: Option<&Vec<core::PodAffinityTerm>>| -> Vec<AffinityTerm> {
            ts.into_iter().flatten().map(|t| AffinityTerm::parse(t, &namespace)).collect()
        };
        let weighted = |ts: Option<&Vec<core::WeightedPodAffinityTerm>>| -> Vec<WeightedAffinityTerm> {
            ts.into_iter()
                .flatten()
                .map(|t| WeightedAffinityTerm {
                    weight: t.weight,
                    term: AffinityTerm::parse(&t.pod_affinity_term, &namespace),
                })
                .collect()
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        PodInfo {
            uid: meta.uid.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            node_name: spec.node_name.clone().unwrap_or_default(),
            scheduler_name: spec.scheduler_name.clone().unwrap_or_else(|| DEFAULT_SCHEDULER_NAME.into()),
            priority: spec.priority.unwrap_or(0),
            requests,
            non_zero_requests,
            host_ports,
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            required_node_affinity: node_affinity
                .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
                .map(NodeSelector::parse),
            preferred_node_affinity: node_affinity
                .and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref())
                .into_iter()
                .flatten()
                .map(|p| (p.weight, NodeSelectorTerm::parse(&p.preference)))
                .collect(),
            tolerations: spec.tolerations.iter().flatten().map(Toleration::from_k8s).collect(),
            required_affinity: terms(
                pod_affinity.and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()),
            ),
            required_anti_affinity: terms(
                pod_anti_affinity.and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()),
            ),
            preferred_affinity: weighted(
                pod_affinity.and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref()),
            ),
            preferred_anti_affinity: weighted(
                pod_anti_affinity.and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref()),
            ),
            spread_constraints: spec
                .topology_spread_constraints
                .iter()
                .flatten()
                .map(|c| SpreadConstraint::parse(c, &labels))
                .collect(),
            runtime_class: spec.runtime_class_name.clone().filter(|c| !c.is_empty()),
            scheduling_gates: spec.scheduling_gates.iter().flatten().map(|g| g.name.clone()).collect(),
            images: spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
                .filter_map(|c| c.image.as_deref())
                .map(normalized_image)
                .collect(),
            controller_uid: meta
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
                .map(|o| o.uid.clone()),
            terminating: meta.deletion_timestamp.is_some(),
            finished: matches!(phase, Some("Succeeded" | "Failed")),
            reported_unschedulable: spec
                .node_name
                .as_deref()
                .is_none_or(str::is_empty)
                .then(|| reported_unschedulable(pod))
                .flatten(),
            labels,
            namespace,
        }
    }

    /// `namespace/name`, as logs and events name a pod.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    pub fn has_affinity(&self) -> bool {
        !self.required_affinity.is_empty()
            || !self.required_anti_affinity.is_empty()
            || !self.preferred_affinity.is_empty()
            || !self.preferred_anti_affinity.is_empty()
    }

    pub fn has_required_anti_affinity(&self) -> bool {
        !self.required_anti_affinity.is_empty()
    }

    /// Whether a spec change could change where this pod fits (labels, requests, affinity, ...):
    /// the scheduler tries an unschedulable pod again when this is true.
    pub fn scheduling_changed(&self, old: &PodInfo) -> bool {
        // The scheduler's own report of a failure is not a reason to try the pod again.
        let strip =
            |p: &PodInfo| PodInfo { resource_version: String::new(), reported_unschedulable: None, ..p.clone() };
        strip(self) != strip(old)
    }
}

/// The message of `pod`'s `PodScheduled=False` condition of reason `Unschedulable`, if it has one.
fn reported_unschedulable(pod: &core::Pod) -> Option<String> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let c = conditions.iter().find(|c| c.type_ == "PodScheduled")?;
    (c.status == "False" && c.reason.as_deref() == Some("Unschedulable")).then(|| c.message.clone().unwrap_or_default())
}

/// An image as node status lists it: a tag of `latest` when the reference has none.
pub fn normalized_image(image: &str) -> String {
    let last = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') || last.contains(':') { image.to_string() } else { format!("{image}:latest") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> PodInfo {
        PodInfo::from_pod(&serde_json::from_value(json).unwrap())
    }

    #[test]
    fn a_pod_is_parsed_into_what_the_plugins_read() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1", "labels": {"app": "web"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-1", "controller": true}]},
            "spec": {
                "containers": [{"name": "c", "image": "nginx", "ports": [{"containerPort": 80, "hostPort": 8080}, {"containerPort": 81}]}],
                "runtimeClassName": "gvisor",
                "priority": 7,
                "tolerations": [{"key": "k", "operator": "Exists"}],
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}]}}
            }
        }));
        assert_eq!((p.namespace.as_str(), p.name.as_str(), p.uid.as_str()), ("ns", "web", "u1"));
        assert_eq!(p.scheduler_name, DEFAULT_SCHEDULER_NAME);
        assert_eq!(p.priority, 7);
        assert_eq!(p.host_ports, vec![HostPort { ip: "0.0.0.0".into(), protocol: "TCP".into(), port: 8080 }]);
        assert_eq!(p.runtime_class.as_deref(), Some("gvisor"));
        assert_eq!(p.images, vec!["nginx:latest"]);
        assert_eq!(p.controller_uid.as_deref(), Some("rs-1"));
        assert_eq!(p.required_anti_affinity.len(), 1);
        assert_eq!(p.required_anti_affinity[0].namespaces, vec!["ns"]);
        assert!(p.required_anti_affinity[0].matches(&p, None));
    }

    #[test]
    fn affinity_namespaces_follow_kubernetes_rules() {
        let other = pod(serde_json::json!({"metadata": {"name": "o", "namespace": "other", "labels": {"app": "web"}}}));
        let term = |t: serde_json::Value| AffinityTerm::parse(&serde_json::from_value(t).unwrap(), "ns");
        let own = term(serde_json::json!({"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "k"}));
        assert!(!own.matches(&other, None));
        let all = term(serde_json::json!({"labelSelector": {}, "namespaceSelector": {}, "topologyKey": "k"}));
        assert!(all.matches(&other, None));
        let labelled = term(
            serde_json::json!({"labelSelector": {}, "namespaceSelector": {"matchLabels": {"team": "a"}}, "topologyKey": "k"}),
        );
        let team_a: BTreeMap<String, String> = [("team".to_string(), "a".to_string())].into();
        assert!(labelled.matches(&other, Some(&team_a)));
        assert!(!labelled.matches(&other, None));
        let null_selector = term(serde_json::json!({"namespaces": ["other"], "topologyKey": "k"}));
        assert!(!null_selector.matches(&other, None), "a null label selector matches no pod");
    }

    #[test]
    fn an_unschedulable_condition_already_written_is_known_while_the_pod_is_pending() {
        let status = |status: &str, reason: &str| serde_json::json!({"conditions": [{"type": "PodScheduled", "status": status, "reason": reason, "message": "0/3 nodes are available"}]});
        let pending = pod(
            serde_json::json!({"metadata": {"name": "a"}, "spec": {"containers": []}, "status": status("False", "Unschedulable")}),
        );
        assert_eq!(pending.reported_unschedulable.as_deref(), Some("0/3 nodes are available"));
        let gated = pod(
            serde_json::json!({"metadata": {"name": "a"}, "spec": {"containers": []}, "status": status("False", "SchedulingGated")}),
        );
        assert_eq!(gated.reported_unschedulable, None, "another reason is not an unschedulable report");
        let bound = pod(
            serde_json::json!({"metadata": {"name": "a"}, "spec": {"containers": [], "nodeName": "n1"}, "status": status("False", "Unschedulable")}),
        );
        assert_eq!(bound.reported_unschedulable, None, "a bound pod keeps nothing of it");
        let fresh = pod(serde_json::json!({"metadata": {"name": "a"}, "spec": {"containers": []}}));
        assert_eq!(fresh.reported_unschedulable, None);
    }

    #[test]
    fn images_without_a_tag_are_latest() {
        assert_eq!(normalized_image("nginx"), "nginx:latest");
        assert_eq!(normalized_image("127.0.0.1:5000/app"), "127.0.0.1:5000/app:latest");
        assert_eq!(normalized_image("127.0.0.1:5000/app:1"), "127.0.0.1:5000/app:1");
        assert_eq!(normalized_image("app@sha256:abc"), "app@sha256:abc");
    }

    #[test]
    fn only_scheduling_relevant_changes_count() {
        let a = pod(serde_json::json!({"metadata": {"name": "a", "resourceVersion": "1"}}));
        let mut b = a.clone();
        b.resource_version = "2".into();
        assert!(!b.scheduling_changed(&a));
        b.reported_unschedulable = Some("0/1 nodes are available".into());
        assert!(!b.scheduling_changed(&a), "the condition the scheduler wrote is not a change");
        b.labels.insert("x".into(), "y".into());
        assert!(b.scheduling_changed(&a));
    }
}
