//! The node controller's taints and the taint-eviction rule: which NoSchedule taints a node's
//! conditions call for, swapping the NoExecute taints, whether a toleration tolerates a taint
//! (Kubernetes' `ToleratesTaint`), and when a pod on a NoExecute-tainted node has to go.

use k8s_openapi::api::core::v1::{Node, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

pub const NOT_READY: &str = "node.kubernetes.io/not-ready";
pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
pub const UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";
pub const MEMORY_PRESSURE: &str = "node.kubernetes.io/memory-pressure";
pub const DISK_PRESSURE: &str = "node.kubernetes.io/disk-pressure";
pub const PID_PRESSURE: &str = "node.kubernetes.io/pid-pressure";
pub const NETWORK_UNAVAILABLE: &str = "node.kubernetes.io/network-unavailable";
pub const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

pub const NO_SCHEDULE: &str = "NoSchedule";
pub const NO_EXECUTE: &str = "NoExecute";

/// Condition type, status, and the NoSchedule taint that pair calls for.
const CONDITION_TAINTS: &[(&str, &str, &str)] = &[
    ("Ready", "False", NOT_READY),
    ("Ready", "Unknown", UNREACHABLE),
    ("MemoryPressure", "True", MEMORY_PRESSURE),
    ("DiskPressure", "True", DISK_PRESSURE),
    ("NetworkUnavailable", "True", NETWORK_UNAVAILABLE),
    ("PIDPressure", "True", PID_PRESSURE),
];

pub fn taint(key: &str, effect: &str, added: Option<jiff::Timestamp>) -> Taint {
    Taint { key: key.into(), effect: effect.into(), value: None, time_added: added.map(Time) }
}

pub fn taints(node: &Node) -> &[Taint] {
    node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or(&[])
}

pub fn has(taints: &[Taint], key: &str, effect: &str) -> bool {
    taints.iter().any(|t| t.key == key && t.effect == effect)
}

/// The NoSchedule taints the node's conditions and `spec.unschedulable` call for (upstream's
/// `doNoScheduleTaintingPass`).
fn wanted_no_schedule(node: &Node) -> Vec<&'static str> {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
    let mut keys: Vec<&'static str> = conditions
        .iter()
        .filter_map(|c| CONDITION_TAINTS.iter().find(|(t, s, _)| *t == c.type_ && *s == c.status).map(|(_, _, k)| *k))
        .collect();
    if node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false) {
        keys.push(UNSCHEDULABLE);
    }
    keys
}

/// The node's taints with the condition NoSchedule taints brought in line with its conditions;
/// `None` when they already are.
pub fn no_schedule_taints(node: &Node) -> Option<Vec<Taint>> {
    let wanted = wanted_no_schedule(node);
    let current = taints(node);
    let managed = |t: &Taint| {
        t.effect == NO_SCHEDULE && (t.key == UNSCHEDULABLE || CONDITION_TAINTS.iter().any(|(_, _, k)| *k == t.key))
    };
    let add: Vec<Taint> =
        wanted.iter().filter(|k| !has(current, k, NO_SCHEDULE)).map(|k| taint(k, NO_SCHEDULE, None)).collect();
    let stale = |t: &Taint| managed(t) && !wanted.contains(&t.key.as_str());
    if add.is_empty() && !current.iter().any(stale) {
        return None;
    }
    let mut out: Vec<Taint> = current.iter().filter(|t| !stale(t)).cloned().collect();
    out.extend(add);
    Some(out)
}

/// `current` with `add` (a taint already there with the same key and effect is kept as it is,
/// its `timeAdded` too) and without the `remove` (key, effect) pairs; `None` if unchanged.
pub fn swapped(current: &[Taint], add: &[Taint], remove: &[(&str, &str)]) -> Option<Vec<Taint>> {
    let mut out: Vec<Taint> =
        current.iter().filter(|t| !remove.iter().any(|(k, e)| t.key == *k && t.effect == *e)).cloned().collect();
    for t in add {
        if !has(&out, &t.key, &t.effect) {
            out.push(t.clone());
        }
    }
    (out != current).then_some(out)
}

/// Kubernetes' `Toleration.ToleratesTaint`.
pub fn tolerates(tol: &Toleration, t: &Taint) -> bool {
    if tol.effect.as_deref().is_some_and(|e| !e.is_empty() && e != t.effect) {
        return false;
    }
    if tol.key.as_deref().is_some_and(|k| !k.is_empty() && k != t.key) {
        return false;
    }
    match tol.operator.as_deref().unwrap_or("") {
        "" | "Equal" => tol.value.as_deref().unwrap_or("") == t.value.as_deref().unwrap_or(""),
        "Exists" => true,
        _ => false,
    }
}

/// When a pod has to leave a node because of its NoExecute taints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eviction {
    Now,
    At(jiff::Timestamp),
    Never,
}

/// The taint-eviction rule: a NoExecute taint no toleration tolerates evicts at once; otherwise
/// the pod goes when the first tolerated taint's `tolerationSeconds` (counted from the taint's
/// `timeAdded`, here paired with each taint) run out; a toleration without seconds tolerates its
/// taint for ever. `taints` are the node's NoExecute taints with the time each was added.
pub fn eviction(taints: &[(&Taint, jiff::Timestamp)], tolerations: &[Toleration], now: jiff::Timestamp) -> Eviction {
    let mut due: Option<jiff::Timestamp> = None;
    for (t, added) in taints {
        let Some(tol) = tolerations.iter().find(|tol| tolerates(tol, t)) else { return Eviction::Now };
        let Some(seconds) = tol.toleration_seconds else { continue };
        if seconds <= 0 {
            return Eviction::Now;
        }
        let at = added.checked_add(jiff::SignedDuration::from_secs(seconds)).unwrap_or(jiff::Timestamp::MAX);
        due = Some(due.map_or(at, |d| d.min(at)));
    }
    match due {
        None => Eviction::Never,
        Some(at) if at <= now => Eviction::Now,
        Some(at) => Eviction::At(at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ts(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    fn node(v: serde_json::Value) -> Node {
        serde_json::from_value(v).unwrap()
    }

    fn tol(v: serde_json::Value) -> Toleration {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn conditions_call_for_no_schedule_taints_and_stale_ones_go() {
        let n = node(json!({
            "spec": {"unschedulable": true, "taints": [
                {"key": "node.kubernetes.io/memory-pressure", "effect": "NoSchedule"},
                {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
            ]},
            "status": {"conditions": [
                {"type": "Ready", "status": "Unknown"},
                {"type": "MemoryPressure", "status": "False"},
                {"type": "DiskPressure", "status": "True"},
            ]},
        }));
        let out = no_schedule_taints(&n).unwrap();
        let keys: Vec<(&str, &str)> = out.iter().map(|t| (t.key.as_str(), t.effect.as_str())).collect();
        assert_eq!(
            keys,
            vec![
                ("dedicated", "NoSchedule"),
                ("node.kubernetes.io/unreachable", "NoExecute"),
                ("node.kubernetes.io/unreachable", "NoSchedule"),
                ("node.kubernetes.io/disk-pressure", "NoSchedule"),
                ("node.kubernetes.io/unschedulable", "NoSchedule"),
            ]
        );
        let mut settled = n.clone();
        settled.spec.as_mut().unwrap().taints = Some(out);
        assert_eq!(no_schedule_taints(&settled), None);
    }

    #[test]
    fn a_ready_node_loses_its_not_ready_taint() {
        let n = node(json!({
            "spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }));
        assert_eq!(no_schedule_taints(&n), Some(vec![]));
    }

    #[test]
    fn swapping_keeps_an_existing_taint_and_its_time() {
        let old = taint(UNREACHABLE, NO_EXECUTE, Some(ts("2025-01-01T00:00:00Z")));
        let new = taint(UNREACHABLE, NO_EXECUTE, Some(ts("2025-01-01T00:05:00Z")));
        assert_eq!(swapped(std::slice::from_ref(&old), std::slice::from_ref(&new), &[(NOT_READY, NO_EXECUTE)]), None);
        let nr = taint(NOT_READY, NO_EXECUTE, Some(ts("2025-01-01T00:05:00Z")));
        assert_eq!(
            swapped(std::slice::from_ref(&old), std::slice::from_ref(&nr), &[(UNREACHABLE, NO_EXECUTE)]),
            Some(vec![nr])
        );
    }

    #[test]
    fn tolerations_match_as_kubernetes_matches_them() {
        let t = taint(UNREACHABLE, NO_EXECUTE, None);
        assert!(tolerates(&tol(json!({"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"})), &t));
        assert!(tolerates(&tol(json!({"operator": "Exists"})), &t));
        assert!(tolerates(&tol(json!({"key": UNREACHABLE})), &t), "Equal with an empty value");
        assert!(!tolerates(&tol(json!({"key": UNREACHABLE, "value": "x"})), &t));
        assert!(!tolerates(&tol(json!({"key": UNREACHABLE, "operator": "Exists", "effect": "NoSchedule"})), &t));
        assert!(!tolerates(&tol(json!({"key": NOT_READY, "operator": "Exists"})), &t));
    }

    #[test]
    fn pods_are_evicted_at_once_after_their_toleration_seconds_or_never() {
        let added = ts("2025-01-01T00:00:00Z");
        let now = ts("2025-01-01T00:00:01Z");
        let t = taint(UNREACHABLE, NO_EXECUTE, Some(added));
        let nr = taint(NOT_READY, NO_EXECUTE, Some(added));
        let taints = [(&t, added)];
        let seconds = |s: i64| {
            tol(json!({"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": s}))
        };
        let forever = tol(json!({"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"}));
        assert_eq!(eviction(&taints, &[], now), Eviction::Now);
        assert_eq!(eviction(&taints, &[seconds(2)], now), Eviction::At(ts("2025-01-01T00:00:02Z")));
        assert_eq!(eviction(&taints, &[seconds(1)], now), Eviction::Now);
        assert_eq!(eviction(&taints, &[seconds(0)], now), Eviction::Now);
        assert_eq!(eviction(&taints, std::slice::from_ref(&forever), now), Eviction::Never);
        // Every taint must be tolerated; the earliest deadline wins.
        assert_eq!(eviction(&[(&t, added), (&nr, added)], std::slice::from_ref(&forever), now), Eviction::Now);
        let both = [
            seconds(30),
            tol(json!({"key": NOT_READY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10})),
        ];
        assert_eq!(eviction(&[(&t, added), (&nr, added)], &both, now), Eviction::At(ts("2025-01-01T00:00:10Z")));
        assert_eq!(eviction(&[], &[], now), Eviction::Never);
    }
}
