//! NodeRestriction: what a node agent's own user (`system:node:<node>`) may write, as
//! Kubernetes' admission plugin of that name: its own Node (never its taints or
//! `node-restriction.kubernetes.io` labels), its own Lease, the status of pods bound to it, and
//! deletes of those pods; no pods of its own.

use std::collections::{BTreeMap, BTreeSet};

use berth_api::ResourceType;
use berth_api::resources::{LEASES, NODES, PODS};
use serde_json::Value;

use super::{Attributes, Operation};
use crate::authz::{Identity, NODE_LEASE_NAMESPACE, identity, with_request_user};
use crate::{ApiError, ApiResult, objects};

/// Labels in this domain (and its subdomains) steer workloads; nodes may not set them.
const NODE_RESTRICTION_LABEL_DOMAIN: &str = "node-restriction.kubernetes.io";
const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// `kubernetes.io` labels a kubelet may set on its own Node (`k8s.io/kubelet/pkg/apis`).
const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
];
/// Label domains a kubelet may use freely.
const KUBELET_LABEL_DOMAINS: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

/// A write to one object, as admission sees it.
#[derive(Debug, Clone, Copy)]
pub enum Write<'a> {
    Create(&'a Value),
    Update { old: &'a Value, new: &'a Value },
    Delete(&'a Value),
}

impl Write<'_> {
    fn operation(&self) -> &'static str {
        match self {
            Write::Create(_) => "CREATE",
            Write::Update { .. } => "UPDATE",
            Write::Delete(_) => "DELETE",
        }
    }
}

/// The plugin: restricts what a node's own user may write, as `node_restriction` decides;
/// requests of other users (and the server's own writes) pass. `obj` is the object being
/// created or the new object of an update.
pub fn admit(attrs: &Attributes<'_>, obj: Option<&Value>) -> ApiResult<()> {
    let write = match (attrs.operation, obj, attrs.old) {
        (Operation::Create, Some(obj), _) => Write::Create(obj),
        (Operation::Update, Some(new), Some(old)) => Write::Update { old, new },
        (Operation::Delete, _, Some(old)) => Write::Delete(old),
        _ => return Ok(()),
    };
    let t = attrs.target;
    let verdict = with_request_user(|user| {
        // No request user: a request without authentication or the server's own loops.
        let Some(user) = user else { return Ok(()) };
        match identity(user) {
            Identity::Master | Identity::Other => Ok(()),
            Identity::UnknownNode => Err(format!("could not determine node from user {:?}", user.name)),
            Identity::Node(node) => {
                node_restriction(node, t.rt, t.subresource.as_deref(), t.namespace.as_deref(), attrs.name, write)
            }
        }
    });
    verdict.map_err(|why| ApiError::forbidden(t.rt, attrs.name, &why))
}

/// NodeRestriction: why node `node` may not make `write` to object `name` of `rt`.
pub fn node_restriction(
    node: &str,
    rt: &ResourceType,
    subresource: Option<&str>,
    namespace: Option<&str>,
    name: &str,
    write: Write<'_>,
) -> Result<(), String> {
    if std::ptr::eq(rt, &PODS) {
        admit_pod(node, subresource, write)
    } else if std::ptr::eq(rt, &NODES) {
        admit_node(node, name, write)
    } else if std::ptr::eq(rt, &LEASES) {
        admit_lease(node, namespace, name)
    } else {
        Ok(())
    }
}

fn node_name_of(pod: &Value) -> &str {
    pod.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or_default()
}

fn admit_pod(node: &str, subresource: Option<&str>, write: Write<'_>) -> Result<(), String> {
    match (subresource, write) {
        (None, Write::Create(pod)) => {
            let mirror =
                objects::meta(pod).pointer(&format!("/annotations/{}", MIRROR_POD_ANNOTATION.replace('/', "~1")));
            match mirror {
                None => Err(format!(
                    "pod does not have {MIRROR_POD_ANNOTATION:?} annotation, node {node:?} can only create mirror pods"
                )),
                Some(_) => Err(format!("node {node:?} cannot create mirror pods: this server does not support them")),
            }
        }
        (None, Write::Delete(old)) if node_name_of(old) != node => {
            Err(format!("node {node:?} can only delete pods with spec.nodeName set to itself"))
        }
        (None, Write::Delete(_)) => Ok(()),
        (None, write) => Err(format!(
            "unexpected operation {:?}, node {node:?} can only create and delete mirror pods",
            write.operation()
        )),
        (Some("status"), Write::Update { old, new }) => {
            if node_name_of(old) != node {
                return Err(format!(
                    "node {node:?} can only update pod status for pods with spec.nodeName set to itself"
                ));
            }
            if objects::labels(old) != objects::labels(new) {
                return Err(format!("node {node:?} cannot update labels through pod status"));
            }
            Ok(())
        }
        (Some("status"), write) => Err(format!("unexpected operation {:?}", write.operation())),
        (Some(other), _) => {
            Err(format!("unexpected pod subresource {other:?}, only 'status' and 'eviction' are allowed"))
        }
    }
}

fn admit_node(node: &str, name: &str, write: Write<'_>) -> Result<(), String> {
    if name != node {
        return Err(format!("node {node:?} is not allowed to modify node {name:?}"));
    }
    let config_source = |n: &Value| n.pointer("/spec/configSource").filter(|v| !v.is_null()).cloned();
    match write {
        Write::Create(new) => {
            if config_source(new).is_some() {
                return Err(format!("node {node:?} is not allowed to create pods with a non-nil configSource"));
            }
            let forbidden = forbidden_labels(&objects::labels(new), &BTreeMap::new());
            if !forbidden.is_empty() {
                return Err(format!(
                    "node {node:?} is not allowed to set the following labels: {}",
                    forbidden.into_iter().collect::<Vec<_>>().join(", ")
                ));
            }
        }
        Write::Update { old, new } => {
            if config_source(new).is_some_and(|c| Some(c) != config_source(old)) {
                return Err(format!(
                    "node {node:?} is not allowed to update configSource to a new non-nil configSource"
                ));
            }
            if taints(old) != taints(new) {
                return Err(format!("node {node:?} is not allowed to modify taints"));
            }
            let forbidden = forbidden_labels(&objects::labels(new), &objects::labels(old));
            if !forbidden.is_empty() {
                return Err(format!(
                    "is not allowed to modify labels: {}",
                    forbidden.into_iter().collect::<Vec<_>>().join(", ")
                ));
            }
        }
        Write::Delete(_) => {}
    }
    Ok(())
}

/// A node's taints; absent and empty are the same, as Kubernetes' semantic equality has it.
fn taints(node: &Value) -> &[Value] {
    node.pointer("/spec/taints").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default()
}

/// Labels added, changed or removed between `old` and `new` that a node may not touch: the
/// `node-restriction.kubernetes.io` domain and `kubernetes.io`/`k8s.io` labels kubelets do not own.
fn forbidden_labels(new: &BTreeMap<String, String>, old: &BTreeMap<String, String>) -> BTreeSet<String> {
    let modified = new
        .iter()
        .filter(|(k, v)| old.get(*k) != Some(*v))
        .chain(old.iter().filter(|(k, v)| new.get(*k) != Some(*v)))
        .map(|(k, _)| k);
    modified.filter(|key| is_forbidden_node_label(key)).cloned().collect()
}

fn label_domain(key: &str) -> &str {
    key.split_once('/').map(|(domain, _)| domain).unwrap_or_default()
}

fn in_domain(domain: &str, parent: &str) -> bool {
    domain == parent || domain.strip_suffix(parent).is_some_and(|d| d.ends_with('.'))
}

fn is_forbidden_node_label(key: &str) -> bool {
    let domain = label_domain(key);
    if in_domain(domain, NODE_RESTRICTION_LABEL_DOMAIN) {
        return true;
    }
    let kubernetes = in_domain(domain, "kubernetes.io") || in_domain(domain, "k8s.io");
    let kubelet = KUBELET_LABELS.contains(&key) || KUBELET_LABEL_DOMAINS.iter().any(|d| in_domain(domain, d));
    kubernetes && !kubelet
}

fn admit_lease(node: &str, namespace: Option<&str>, name: &str) -> Result<(), String> {
    if namespace != Some(NODE_LEASE_NAMESPACE) {
        return Err(format!("can only access leases in the {NODE_LEASE_NAMESPACE:?} system namespace"));
    }
    if name != node {
        return Err("can only access node lease with the same name as the requesting node".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authn::UserInfo;
    use crate::authz::serve_as;
    use crate::request::Target;
    use serde_json::json;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo { name: name.into(), groups: groups.iter().map(|g| g.to_string()).collect(), ..Default::default() }
    }

    fn node_a() -> UserInfo {
        user("system:node:node-a", &["system:nodes", "system:authenticated"])
    }

    /// The plugin on the deletion of the stored `old` at `t`.
    fn admit_delete(t: &Target, old: &Value) -> ApiResult<()> {
        let attrs = Attributes { target: t, name: objects::name(old), operation: Operation::Delete, old: Some(old) };
        admit(&attrs, None)
    }

    fn node_obj(labels: Value, taints: Value) -> Value {
        json!({"metadata": {"name": "node-a", "labels": labels}, "spec": {"taints": taints}})
    }

    #[test]
    fn a_node_may_not_modify_another_node() {
        let n = node_obj(json!({}), json!(null));
        assert_eq!(
            admit_node("node-a", "node-b", Write::Update { old: &n, new: &n }),
            Err("node \"node-a\" is not allowed to modify node \"node-b\"".into())
        );
        assert!(admit_node("node-a", "node-b", Write::Delete(&n)).is_err());
        assert_eq!(admit_node("node-a", "node-a", Write::Delete(&n)), Ok(()));
    }

    #[test]
    fn node_restriction_labels_may_not_be_set_changed_or_removed_by_the_node() {
        let plain = node_obj(json!({"kubernetes.io/hostname": "a", "app": "x"}), json!(null));
        let restricted = node_obj(json!({"node-restriction.kubernetes.io/pool": "gpu"}), json!(null));
        assert_eq!(admit_node("node-a", "node-a", Write::Create(&plain)), Ok(()));
        assert_eq!(
            admit_node("node-a", "node-a", Write::Create(&restricted)),
            Err("node \"node-a\" is not allowed to set the following labels: node-restriction.kubernetes.io/pool"
                .into())
        );
        for (old, new) in [(&plain, &restricted), (&restricted, &plain)] {
            assert_eq!(
                admit_node("node-a", "node-a", Write::Update { old, new }),
                Err("is not allowed to modify labels: node-restriction.kubernetes.io/pool".into()),
                "{old} -> {new}"
            );
        }
        let sub = node_obj(json!({"x.node-restriction.kubernetes.io/a": "1"}), json!(null));
        assert!(admit_node("node-a", "node-a", Write::Create(&sub)).is_err());
        // Unchanged restricted labels (an admin set them) do not stop a status or label update.
        let with_app = node_obj(json!({"node-restriction.kubernetes.io/pool": "gpu", "app": "y"}), json!(null));
        assert_eq!(admit_node("node-a", "node-a", Write::Update { old: &restricted, new: &with_app }), Ok(()));
    }

    #[test]
    fn kubernetes_labels_outside_the_kubelet_set_are_forbidden_to_nodes() {
        for allowed in [
            "kubernetes.io/os",
            "node.kubernetes.io/exclude-from-external-load-balancers",
            "a.kubelet.kubernetes.io/x",
            "berth.dev/runtime",
            "plain",
        ] {
            assert!(!is_forbidden_node_label(allowed), "{allowed}");
        }
        for forbidden in ["node-role.kubernetes.io/control-plane", "k8s.io/x", "example.k8s.io/y", "kubernetes.io/team"]
        {
            assert!(is_forbidden_node_label(forbidden), "{forbidden}");
        }
        // A domain merely ending in the same letters is not a subdomain.
        assert!(!is_forbidden_node_label("notkubernetes.io/x"));
    }

    #[test]
    fn a_node_may_not_change_its_taints_but_absent_and_empty_are_equal() {
        let none = node_obj(json!({}), json!(null));
        let empty = node_obj(json!({}), json!([]));
        let tainted = node_obj(json!({}), json!([{"key": "k", "effect": "NoSchedule"}]));
        assert_eq!(admit_node("node-a", "node-a", Write::Update { old: &none, new: &empty }), Ok(()));
        assert_eq!(
            admit_node("node-a", "node-a", Write::Update { old: &tainted, new: &none }),
            Err("node \"node-a\" is not allowed to modify taints".into())
        );
        // Registering with taints is allowed, as a kubelet's --register-with-taints.
        assert_eq!(admit_node("node-a", "node-a", Write::Create(&tainted)), Ok(()));
    }

    #[test]
    fn a_node_writes_status_and_deletes_only_pods_bound_to_it() {
        let mine = json!({"metadata": {"name": "p", "labels": {"a": "1"}}, "spec": {"nodeName": "node-a"}});
        let theirs = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "node-b"}});
        let relabelled = json!({"metadata": {"name": "p", "labels": {"a": "2"}}, "spec": {"nodeName": "node-a"}});
        assert_eq!(admit_pod("node-a", Some("status"), Write::Update { old: &mine, new: &mine }), Ok(()));
        assert_eq!(
            admit_pod("node-a", Some("status"), Write::Update { old: &theirs, new: &theirs }),
            Err("node \"node-a\" can only update pod status for pods with spec.nodeName set to itself".into())
        );
        assert_eq!(
            admit_pod("node-a", Some("status"), Write::Update { old: &mine, new: &relabelled }),
            Err("node \"node-a\" cannot update labels through pod status".into())
        );
        assert_eq!(admit_pod("node-a", None, Write::Delete(&mine)), Ok(()));
        assert_eq!(
            admit_pod("node-a", None, Write::Delete(&theirs)),
            Err("node \"node-a\" can only delete pods with spec.nodeName set to itself".into())
        );
        assert_eq!(
            admit_pod("node-a", None, Write::Update { old: &mine, new: &mine }),
            Err("unexpected operation \"UPDATE\", node \"node-a\" can only create and delete mirror pods".into())
        );
    }

    #[test]
    fn a_node_may_not_create_pods() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "node-a"}});
        assert_eq!(
            admit_pod("node-a", None, Write::Create(&pod)),
            Err("pod does not have \"kubernetes.io/config.mirror\" annotation, node \"node-a\" can only create mirror pods"
                .into())
        );
        let mirror = json!({"metadata": {"name": "p", "annotations": {"kubernetes.io/config.mirror": "x"}}});
        assert!(admit_pod("node-a", None, Write::Create(&mirror)).is_err());
    }

    #[test]
    fn a_node_creates_only_its_own_lease() {
        assert_eq!(admit_lease("node-a", Some("kube-node-lease"), "node-a"), Ok(()));
        assert_eq!(
            admit_lease("node-a", Some("kube-node-lease"), "node-b"),
            Err("can only access node lease with the same name as the requesting node".into())
        );
        assert!(admit_lease("node-a", Some("default"), "node-a").is_err());
    }

    #[test]
    fn other_resources_are_not_restricted_by_admission() {
        let obj = json!({"metadata": {"name": "e"}});
        let events = &berth_api::resources::EVENTS;
        assert_eq!(node_restriction("node-a", events, None, Some("default"), "e", Write::Create(&obj)), Ok(()));
    }

    #[tokio::test]
    async fn admission_applies_only_inside_a_request_of_a_node() {
        let target = Target { rt: &NODES, namespace: None, name: Some("node-b".into()), subresource: None };
        let node_b = json!({"metadata": {"name": "node-b"}});
        assert!(admit_delete(&target, &node_b).is_ok());
        let as_node = serve_as(Some(node_a()), async { admit_delete(&target, &node_b) }).await;
        let error = as_node.unwrap_err();
        assert_eq!(
            error.message,
            "nodes \"node-b\" is forbidden: node \"node-a\" is not allowed to modify node \"node-b\""
        );
        let admin = user("admin", &["system:masters"]);
        assert!(serve_as(Some(admin), async { admit_delete(&target, &node_b) }).await.is_ok());
    }
}
