//! The pure cores of the ReplicaSet, ReplicationController and Deployment controllers: every
//! decision they make, as functions of API objects and the clock, with no IO.
//!
//! The vocabulary is kube-controller-manager's (`pkg/controller/replicaset`,
//! `pkg/controller/deployment` and `pkg/controller/controller_utils.go`): expectations, slow-start
//! batches, active pods ranked for deletion, fenceposts, proportional scaling, revisions. The
//! shells (`replicaset.rs`, also run over ReplicationControllers by `replication.rs`, and
//! `deployment.rs`) feed these from reflector stores and write what they decide through the API.

pub mod expectations;
pub mod pacing;
pub mod pods;
pub mod progress;
pub mod replicas;
pub mod replicated;
pub mod retry;
pub mod revision;
pub mod rollout;
pub mod tracker;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::Serialize;
use serde_json::Value;

/// The label a Deployment puts on its ReplicaSets' selectors, templates and pods.
pub const POD_TEMPLATE_HASH_LABEL: &str = "pod-template-hash";

/// `namespace/name`, the key of an object in the work queue and in expectations.
pub fn key_of(meta: &ObjectMeta) -> String {
    format!("{}/{}", meta.namespace.as_deref().unwrap_or(""), meta.name.as_deref().unwrap_or(""))
}

/// The owner reference with `controller: true`, if any (`metav1.GetControllerOf`).
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references.iter().flatten().find(|r| r.controller == Some(true))
}

/// A controller reference to `owner` as `metav1.NewControllerRef` makes it.
pub fn controller_ref(api_version: &str, kind: &str, owner: &ObjectMeta) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: owner.name.clone().unwrap_or_default(),
        uid: owner.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The message of an API error (its `Status` message, as Go's `err.Error()` shows it), or the
/// error itself.
pub fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        other => other.to_string(),
    }
}

pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_not_found())
}

pub fn is_already_exists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_already_exists())
}

pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_conflict())
}

/// Nothing can be created in a namespace being deleted (`NamespaceTerminatingCause`).
pub fn namespace_terminating(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating")))
}

/// The API's timestamps have whole seconds; values compared with what comes back from the server
/// are truncated the same way, or every comparison would see a change.
pub fn api_time(now: jiff::Timestamp) -> Time {
    Time(jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// Whether two values are equal as Go's `apiequality.Semantic.DeepEqual` sees them after a round
/// trip through JSON: absent, null, zero, empty and false are all the same.
pub fn semantically_equal<T: Serialize>(a: &T, b: &T) -> bool {
    match (serde_json::to_value(a), serde_json::to_value(b)) {
        (Ok(x), Ok(y)) => normalize(&x, true) == normalize(&y, true),
        _ => false,
    }
}

/// Drops what Go's zero values make equal to absence: null, "", false, empty lists and maps, and
/// (when `zero_numbers`) numeric zeros. Object keys end up sorted, so the result is canonical.
pub(crate) fn normalize(v: &Value, zero_numbers: bool) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let mut out = serde_json::Map::new();
            for k in keys {
                let n = normalize(&m[k], zero_numbers);
                if !is_zero(&n, zero_numbers) {
                    out.insert(k.clone(), n);
                }
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| normalize(x, zero_numbers)).collect()),
        other => other.clone(),
    }
}

fn is_zero(v: &Value, zero_numbers: bool) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Bool(b) => !b,
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.is_empty(),
        Value::Number(n) => zero_numbers && n.as_f64() == Some(0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_and_zero_values_compare_equal() {
        let a = serde_json::json!({"a": 0, "b": "", "c": [], "d": {"e": null}, "f": false});
        let b = serde_json::json!({});
        assert!(semantically_equal(&a, &b));
        assert!(!semantically_equal(&serde_json::json!({"a": 1}), &b));
    }

    #[test]
    fn api_time_drops_the_fraction_of_a_second() {
        let t: jiff::Timestamp = "2024-05-01T10:00:00.75Z".parse().unwrap();
        assert_eq!(api_time(t).0.to_string(), "2024-05-01T10:00:00Z");
    }
}
