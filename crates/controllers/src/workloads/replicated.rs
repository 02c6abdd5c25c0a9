//! The kinds the replica controller keeps pods for — ReplicaSet and ReplicationController — as
//! one trait: how each reads its spec and status and takes a new status, in one place per kind.
//!
//! kube-controller-manager runs the ReplicaSet controller over ReplicationControllers by
//! converting them to ReplicaSets and back (`pkg/controller/replication/conversion.go`). Here the
//! controller is generic over [`Replicated`] instead, so events, owner references and API calls
//! name the real kind; the status is the one thing converted, since the two kinds' statuses have
//! the same fields and the pure cores compute a `ReplicaSetStatus`.

use std::fmt::Debug;

use berth_api::selector::LabelSelector;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetStatus};
use k8s_openapi::api::core::v1::{PodTemplateSpec, ReplicationController};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as K8sSelector;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// An object that keeps `replicas` pods from its template, matched by its selector.
pub trait Replicated:
    kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// The controller's name, as kube-controller-manager's `--controllers` and the logs say it.
    const CONTROLLER: &'static str;
    /// The kind in words, as error messages say it (`replica set`).
    const NOUN: &'static str;

    /// Whether the object has a spec at all; without one there is nothing to do.
    fn has_spec(&self) -> bool;
    /// `spec.replicas`, 1 when unset.
    fn replicas(&self) -> i32;
    /// `spec.minReadySeconds`, 0 when unset.
    fn min_ready_seconds(&self) -> i32;
    /// The selector of the pods it owns.
    fn selector(&self) -> Result<LabelSelector, String>;
    fn template(&self) -> Option<&PodTemplateSpec>;
    /// The stored status, as a ReplicaSet's.
    fn replica_status(&self) -> Option<ReplicaSetStatus>;
    fn set_replica_status(&mut self, status: ReplicaSetStatus);

    /// Whether an owner reference's `apiVersion` and `kind` name this kind (any version).
    fn is_kind_of(api_version: &str, kind: &str) -> bool {
        let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
        kind == Self::kind(&()) && group == Self::group(&())
    }
}

impl Replicated for ReplicaSet {
    const CONTROLLER: &'static str = "replicaset";
    const NOUN: &'static str = "replica set";

    fn has_spec(&self) -> bool {
        self.spec.is_some()
    }

    fn replicas(&self) -> i32 {
        self.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
    }

    fn min_ready_seconds(&self) -> i32 {
        self.spec.as_ref().and_then(|s| s.min_ready_seconds).unwrap_or(0)
    }

    fn selector(&self) -> Result<LabelSelector, String> {
        match self.spec.as_ref() {
            Some(spec) => LabelSelector::from_k8s(&spec.selector),
            None => LabelSelector::from_k8s(&K8sSelector::default()),
        }
    }

    fn template(&self) -> Option<&PodTemplateSpec> {
        self.spec.as_ref()?.template.as_ref()
    }

    fn replica_status(&self) -> Option<ReplicaSetStatus> {
        self.status.clone()
    }

    fn set_replica_status(&mut self, status: ReplicaSetStatus) {
        self.status = Some(status);
    }
}

/// A ReplicationController's selector is a plain map: its labels, all required (the API server
/// defaults it to the template's labels).
impl Replicated for ReplicationController {
    const CONTROLLER: &'static str = "replicationcontroller";
    const NOUN: &'static str = "replication controller";

    fn has_spec(&self) -> bool {
        self.spec.is_some()
    }

    fn replicas(&self) -> i32 {
        self.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
    }

    fn min_ready_seconds(&self) -> i32 {
        self.spec.as_ref().and_then(|s| s.min_ready_seconds).unwrap_or(0)
    }

    fn selector(&self) -> Result<LabelSelector, String> {
        let match_labels = self.spec.as_ref().and_then(|s| s.selector.clone());
        LabelSelector::from_k8s(&K8sSelector { match_labels, match_expressions: None })
    }

    fn template(&self) -> Option<&PodTemplateSpec> {
        self.spec.as_ref()?.template.as_ref()
    }

    fn replica_status(&self) -> Option<ReplicaSetStatus> {
        self.status.as_ref().map(same_fields)
    }

    fn set_replica_status(&mut self, status: ReplicaSetStatus) {
        self.status = Some(same_fields(&status));
    }
}

/// The two kinds' statuses (and conditions) have the same fields under the same names: one is
/// the other through their JSON (a ReplicaSet's `terminatingReplicas` has no place in an RC's).
fn same_fields<A: Serialize, B: DeserializeOwned + Default>(from: &A) -> B {
    serde_json::to_value(from).ok().and_then(|v| serde_json::from_value(v).ok()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::ReplicaSetCondition;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn rc(spec: serde_json::Value) -> ReplicationController {
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "ns"}, "spec": spec})).unwrap()
    }

    #[test]
    fn a_replication_controller_selects_by_every_label_of_its_map() {
        let rc = rc(json!({"selector": {"app": "web", "tier": "fe"}}));
        let selector = rc.selector().unwrap();
        let labels = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert!(selector.matches(&labels(&[("app", "web"), ("tier", "fe"), ("x", "y")])));
        assert!(!selector.matches(&labels(&[("app", "web")])));
    }

    #[test]
    fn a_replication_controller_defaults_to_one_replica_and_no_minimum_ready_time() {
        let rc = rc(json!({}));
        assert_eq!((rc.replicas(), rc.min_ready_seconds()), (1, 0));
        let rc = self::rc(json!({"replicas": 0, "minReadySeconds": 7}));
        assert_eq!((rc.replicas(), rc.min_ready_seconds()), (0, 7));
    }

    #[test]
    fn a_replication_controller_status_round_trips_through_a_replica_set_status() {
        let mut rc = rc(json!({}));
        assert_eq!(rc.replica_status(), None);
        let status = ReplicaSetStatus {
            replicas: 3,
            fully_labeled_replicas: Some(3),
            ready_replicas: Some(2),
            available_replicas: Some(1),
            observed_generation: Some(4),
            terminating_replicas: None,
            conditions: Some(vec![ReplicaSetCondition {
                type_: "ReplicaFailure".into(),
                status: "True".into(),
                reason: Some("FailedCreate".into()),
                message: Some("quota".into()),
                last_transition_time: Some(Time(jiff::Timestamp::UNIX_EPOCH)),
            }]),
        };
        rc.set_replica_status(status.clone());
        let written = rc.status.as_ref().unwrap();
        assert_eq!((written.replicas, written.observed_generation), (3, Some(4)));
        assert_eq!(written.conditions.as_ref().unwrap()[0].reason.as_deref(), Some("FailedCreate"));
        assert_eq!(rc.replica_status(), Some(status));
    }

    #[test]
    fn an_owner_reference_names_the_kind_by_group_and_kind_in_any_version() {
        assert!(ReplicaSet::is_kind_of("apps/v1", "ReplicaSet"));
        assert!(ReplicaSet::is_kind_of("apps/v1beta2", "ReplicaSet"));
        assert!(!ReplicaSet::is_kind_of("extensions/v1beta1", "ReplicaSet"));
        assert!(!ReplicaSet::is_kind_of("v1", "ReplicationController"));
        assert!(ReplicationController::is_kind_of("v1", "ReplicationController"));
        assert!(!ReplicationController::is_kind_of("apps/v1", "ReplicationController"));
        assert!(!ReplicationController::is_kind_of("v1", "ReplicaSet"));
    }
}
