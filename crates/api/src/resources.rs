//! The resource types the control plane serves: names, scope, subresources, and typed decoding.

use k8s_openapi::api::{apps, coordination, core, discovery, events, networking, node};
use serde_json::Value;

/// One served resource, e.g. `pods` in core/v1 or `runtimeclasses` in node.k8s.io/v1.
#[derive(Debug, PartialEq, Eq)]
pub struct ResourceType {
    /// API group; "" for the core group.
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Has a `/status` subresource (status is ignored on updates of the main resource).
    pub has_status: bool,
    /// Has a `/scale` subresource.
    pub has_scale: bool,
    /// Where objects live in the store: `/registry/<storage>/...`. Two views of one resource
    /// (core/v1 and events.k8s.io/v1 events) share it.
    pub storage: &'static str,
}

impl ResourceType {
    /// `v1` or `apps/v1`, as in `apiVersion`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.to_string() } else { format!("{}/{}", self.group, self.version) }
    }

    /// `pods` or `deployments.apps`, as in error messages.
    pub fn qualified_plural(&self) -> String {
        if self.group.is_empty() { self.plural.to_string() } else { format!("{}.{}", self.plural, self.group) }
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// Decodes `obj` as this kind and encodes it again: what a Go apiserver's decoder would keep.
    /// Unknown fields are dropped; a field of the wrong type is an error naming it.
    pub fn roundtrip(&self, obj: &Value) -> Result<Value, String> {
        fn rt<T: serde::de::DeserializeOwned + serde::Serialize>(v: &Value) -> Result<Value, String> {
            // Go writes a zero `metav1.Time` as null, which the typed conditions cannot hold: it
            // goes through as Go's zero time and comes back as null.
            let mut v = v.clone();
            let zeroed = set_null_transition_times(&mut v, Value::String(ZERO_TIME.into()));
            let typed: T = serde_json::from_value(v).map_err(|e| e.to_string())?;
            let mut out = serde_json::to_value(typed).map_err(|e| e.to_string())?;
            if zeroed {
                restore_zero_transition_times(&mut out);
            }
            Ok(out)
        }
        match (self.group, self.kind) {
            ("", "Namespace") => rt::<core::v1::Namespace>(obj),
            ("", "Pod") => rt::<core::v1::Pod>(obj),
            ("", "Node") => rt::<core::v1::Node>(obj),
            ("", "ConfigMap") => rt::<core::v1::ConfigMap>(obj),
            ("", "Secret") => rt::<core::v1::Secret>(obj),
            ("", "ServiceAccount") => rt::<core::v1::ServiceAccount>(obj),
            ("", "Event") => rt::<core::v1::Event>(obj),
            ("", "Service") => rt::<core::v1::Service>(obj),
            ("", "Endpoints") => rt::<core::v1::Endpoints>(obj),
            ("discovery.k8s.io", "EndpointSlice") => rt::<discovery::v1::EndpointSlice>(obj),
            ("events.k8s.io", "Event") => rt::<events::v1::Event>(obj),
            ("coordination.k8s.io", "Lease") => rt::<coordination::v1::Lease>(obj),
            ("node.k8s.io", "RuntimeClass") => rt::<node::v1::RuntimeClass>(obj),
            ("apps", "Deployment") => rt::<apps::v1::Deployment>(obj),
            ("apps", "ReplicaSet") => rt::<apps::v1::ReplicaSet>(obj),
            ("", "ReplicationController") => rt::<core::v1::ReplicationController>(obj),
            ("", "PodTemplate") => rt::<core::v1::PodTemplate>(obj),
            ("networking.k8s.io", "Ingress") => rt::<networking::v1::Ingress>(obj),
            ("networking.k8s.io", "IngressClass") => rt::<networking::v1::IngressClass>(obj),
            ("networking.k8s.io", "NetworkPolicy") => rt::<networking::v1::NetworkPolicy>(obj),
            _ => Err(format!("no decoder for {}", self.kind)),
        }
    }
}

/// Go's zero `time.Time`, as RFC 3339.
const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// Sets each `status.conditions[*].lastTransitionTime` that is null to `to`; whether any was.
fn set_null_transition_times(obj: &mut Value, to: Value) -> bool {
    let mut any = false;
    if let Some(conditions) = obj.pointer_mut("/status/conditions").and_then(Value::as_array_mut) {
        for c in conditions {
            if let Some(t) = c.get_mut("lastTransitionTime").filter(|t| t.is_null()) {
                *t = to.clone();
                any = true;
            }
        }
    }
    any
}

fn restore_zero_transition_times(obj: &mut Value) {
    if let Some(conditions) = obj.pointer_mut("/status/conditions").and_then(Value::as_array_mut) {
        for c in conditions {
            if let Some(t) = c.get_mut("lastTransitionTime").filter(|t| t.as_str() == Some(ZERO_TIME)) {
                *t = Value::Null;
            }
        }
    }
}

macro_rules! rtype {
    ($group:expr, $kind:expr, $plural:expr, $singular:expr, $ns:expr, $short:expr, $cat:expr, $status:expr, $scale:expr, $storage:expr) => {
        ResourceType {
            group: $group,
            version: "v1",
            kind: $kind,
            plural: $plural,
            singular: $singular,
            namespaced: $ns,
            short_names: $short,
            categories: $cat,
            has_status: $status,
            has_scale: $scale,
            storage: $storage,
        }
    };
}

pub static NAMESPACES: ResourceType =
    rtype!("", "Namespace", "namespaces", "namespace", false, &["ns"], &[], true, false, "namespaces");
pub static PODS: ResourceType = rtype!("", "Pod", "pods", "pod", true, &["po"], &["all"], true, false, "pods");
pub static NODES: ResourceType = rtype!("", "Node", "nodes", "node", false, &["no"], &[], true, false, "minions");
pub static CONFIGMAPS: ResourceType =
    rtype!("", "ConfigMap", "configmaps", "configmap", true, &["cm"], &[], false, false, "configmaps");
pub static SECRETS: ResourceType = rtype!("", "Secret", "secrets", "secret", true, &[], &[], false, false, "secrets");
pub static SERVICEACCOUNTS: ResourceType = rtype!(
    "",
    "ServiceAccount",
    "serviceaccounts",
    "serviceaccount",
    true,
    &["sa"],
    &[],
    false,
    false,
    "serviceaccounts"
);
pub static SERVICES: ResourceType =
    rtype!("", "Service", "services", "service", true, &["svc"], &["all"], true, false, "services/specs");
pub static ENDPOINTS: ResourceType =
    rtype!("", "Endpoints", "endpoints", "endpoints", true, &["ep"], &[], false, false, "services/endpoints");
pub static ENDPOINTSLICES: ResourceType = rtype!(
    "discovery.k8s.io",
    "EndpointSlice",
    "endpointslices",
    "endpointslice",
    true,
    &[],
    &[],
    false,
    false,
    "endpointslices"
);
pub static EVENTS: ResourceType = rtype!("", "Event", "events", "event", true, &["ev"], &[], false, false, "events");
pub static EVENTS_V1: ResourceType =
    rtype!("events.k8s.io", "Event", "events", "event", true, &["ev"], &[], false, false, "events");
pub static LEASES: ResourceType =
    rtype!("coordination.k8s.io", "Lease", "leases", "lease", true, &[], &[], false, false, "leases");
pub static RUNTIMECLASSES: ResourceType = rtype!(
    "node.k8s.io",
    "RuntimeClass",
    "runtimeclasses",
    "runtimeclass",
    false,
    &[],
    &[],
    false,
    false,
    "runtimeclasses"
);
pub static INGRESSES: ResourceType =
    rtype!("networking.k8s.io", "Ingress", "ingresses", "ingress", true, &["ing"], &[], true, false, "ingress");
pub static INGRESSCLASSES: ResourceType = rtype!(
    "networking.k8s.io",
    "IngressClass",
    "ingressclasses",
    "ingressclass",
    false,
    &[],
    &[],
    false,
    false,
    "ingressclasses"
);
pub static NETWORKPOLICIES: ResourceType = rtype!(
    "networking.k8s.io",
    "NetworkPolicy",
    "networkpolicies",
    "networkpolicy",
    true,
    &["netpol"],
    &[],
    false,
    false,
    "networkpolicies"
);
pub static DEPLOYMENTS: ResourceType =
    rtype!("apps", "Deployment", "deployments", "deployment", true, &["deploy"], &["all"], true, true, "deployments");
pub static REPLICASETS: ResourceType =
    rtype!("apps", "ReplicaSet", "replicasets", "replicaset", true, &["rs"], &["all"], true, true, "replicasets");
pub static REPLICATIONCONTROLLERS: ResourceType = rtype!(
    "",
    "ReplicationController",
    "replicationcontrollers",
    "replicationcontroller",
    true,
    &["rc"],
    &["all"],
    true,
    true,
    "controllers"
);
pub static PODTEMPLATES: ResourceType =
    rtype!("", "PodTemplate", "podtemplates", "podtemplate", true, &[], &[], false, false, "podtemplates");

/// Every served resource, in discovery order.
pub static ALL: &[&ResourceType] = &[
    &NAMESPACES,
    &PODS,
    &NODES,
    &CONFIGMAPS,
    &SECRETS,
    &SERVICEACCOUNTS,
    &SERVICES,
    &ENDPOINTS,
    &REPLICATIONCONTROLLERS,
    &PODTEMPLATES,
    &EVENTS,
    &EVENTS_V1,
    &LEASES,
    &RUNTIMECLASSES,
    &DEPLOYMENTS,
    &REPLICASETS,
    &ENDPOINTSLICES,
    &INGRESSES,
    &INGRESSCLASSES,
    &NETWORKPOLICIES,
];

/// The resource served at `group/version` under `plural`.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceType> {
    ALL.iter().copied().find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The groups served, with their versions, in discovery order ("" is the core group).
pub fn groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in ALL {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_are_found_in_the_core_group() {
        assert_eq!(find("", "v1", "pods"), Some(&PODS));
        assert_eq!(find("apps", "v1", "pods"), None);
    }

    #[test]
    fn roundtrip_drops_unknown_fields_and_rejects_wrong_types() {
        let rc = serde_json::json!({"apiVersion":"node.k8s.io/v1","kind":"RuntimeClass","metadata":{"name":"a"},"handler":"runc","bogus":1});
        let out = RUNTIMECLASSES.roundtrip(&rc).unwrap();
        assert!(out.get("bogus").is_none());
        assert_eq!(out["handler"], "runc");
        let bad = serde_json::json!({"metadata":{"name":"a"},"handler":5});
        assert!(RUNTIMECLASSES.roundtrip(&bad).is_err());
    }

    #[test]
    fn a_condition_without_a_transition_time_goes_through_as_go_writes_it() {
        let svc = serde_json::json!({"metadata": {"name": "a"}, "status": {"conditions": [
            {"type": "StatusUpdate", "status": "True", "reason": "E2E", "message": "m", "lastTransitionTime": null}]}});
        let out = SERVICES.roundtrip(&svc).unwrap();
        assert_eq!(out["status"]["conditions"][0]["lastTransitionTime"], Value::Null);
        assert_eq!(out["status"]["conditions"][0]["reason"], "E2E");
    }
}
