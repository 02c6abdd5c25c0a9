//! The pure parts of the admission plugins that change pods: RuntimeClass (as Kubernetes'
//! built-in plugin, plus berth's default class) and DefaultTolerationSeconds. The server runs
//! them in its admission chain with the objects they need already looked up.

use k8s_openapi::api::core::v1::{Pod, Toleration};
use k8s_openapi::api::node::v1::RuntimeClass;

use crate::validation::resource_lists_equal;

/// Annotation marking the class used for pods that name none.
pub const DEFAULT_CLASS_ANNOTATION: &str = "runtimeclass.berth.dev/is-default-class";

/// The class marked `runtimeclass.berth.dev/is-default-class: "true"`; the newest if several
/// (ties broken by the smaller name, so the choice is deterministic).
pub fn default_runtime_class(classes: &[RuntimeClass]) -> Option<&RuntimeClass> {
    classes
        .iter()
        .filter(|c| {
            c.metadata.annotations.as_ref().and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION)).map(String::as_str)
                == Some("true")
        })
        .max_by(|a, b| {
            let ta = a.metadata.creation_timestamp.as_ref().map(|t| t.0);
            let tb = b.metadata.creation_timestamp.as_ref().map(|t| t.0);
            // Newest wins; for equal times the smaller name wins, so compare names reversed.
            ta.cmp(&tb).then_with(|| b.metadata.name.cmp(&a.metadata.name))
        })
}

/// Admits a pod on CREATE against the class it names (already looked up; `None` = not found):
/// the RuntimeClass plugin's mutation ([`set_runtime_class`]) then its validation
/// ([`validate_runtime_class`]). `Err` carries the message of the 403 Forbidden status (the
/// server prefixes it with `pods "<name>" is forbidden: `, as Kubernetes' admission errors read).
pub fn admit_runtime_class(pod: &mut Pod, class: Option<&RuntimeClass>) -> Result<(), String> {
    set_runtime_class(pod, class)?;
    validate_runtime_class(pod, class)
}

/// The RuntimeClass plugin's mutating half: a named class must exist; its overhead is copied
/// into the pod (a pod-supplied one must equal it) and its scheduling merged into the pod's.
pub fn set_runtime_class(pod: &mut Pod, class: Option<&RuntimeClass>) -> Result<(), String> {
    let spec = pod.spec.get_or_insert_with(Default::default);
    let Some(name) = spec.runtime_class_name.clone() else {
        return Ok(());
    };
    let Some(class) = class else {
        return Err(format!("pod rejected: RuntimeClass {name:?} not found"));
    };

    // Overhead: copied from the class; a pod-supplied one must equal it.
    if let Some(class_fixed) = class.overhead.as_ref().map(|o| o.pod_fixed.clone().unwrap_or_default()) {
        if let Some(own) = spec.overhead.as_ref().filter(|o| !o.is_empty())
            && !resource_lists_equal(own, &class_fixed)
        {
            return Err(OVERHEAD_MISMATCH.into());
        }
        spec.overhead = if class_fixed.is_empty() { None } else { Some(class_fixed) };
    }

    // Scheduling: the class's node selector joins the pod's, and its tolerations are merged.
    if let Some(sched) = &class.scheduling {
        if let Some(class_sel) = sched.node_selector.as_ref().filter(|s| !s.is_empty()) {
            let pod_sel = spec.node_selector.get_or_insert_with(Default::default);
            for (k, v) in class_sel {
                if let Some(pv) = pod_sel.get(k)
                    && pv != v
                {
                    return Err(format!(
                        "conflict: runtimeClass.scheduling.nodeSelector[{k}] = {v}; pod.spec.nodeSelector[{k}] = {pv}"
                    ));
                }
                pod_sel.insert(k.clone(), v.clone());
            }
        }
        let merged =
            merge_tolerations(spec.tolerations.as_deref().unwrap_or(&[]), sched.tolerations.as_deref().unwrap_or(&[]));
        spec.tolerations = if merged.is_empty() { None } else { Some(merged) };
    }
    Ok(())
}

const OVERHEAD_MISMATCH: &str = "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead";

/// The RuntimeClass plugin's validating half: the pod's overhead is exactly its class's, and a
/// pod whose class defines none (or that has no class) sets none.
pub fn validate_runtime_class(pod: &Pod, class: Option<&RuntimeClass>) -> Result<(), String> {
    let own = pod.spec.as_ref().and_then(|s| s.overhead.as_ref()).filter(|o| !o.is_empty());
    match class.and_then(|c| c.overhead.as_ref()) {
        Some(overhead) => {
            let class_fixed = overhead.pod_fixed.clone().unwrap_or_default();
            if !resource_lists_equal(&own.cloned().unwrap_or_default(), &class_fixed) {
                return Err(OVERHEAD_MISMATCH.into());
            }
        }
        None if own.is_some() => {
            return Err("pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead".into());
        }
        None => {}
    }
    Ok(())
}

fn same_toleration(a: &Toleration, b: &Toleration) -> bool {
    let s = |v: &Option<String>| v.clone().unwrap_or_default();
    s(&a.key) == s(&b.key)
        && s(&a.operator) == s(&b.operator)
        && s(&a.value) == s(&b.value)
        && s(&a.effect) == s(&b.effect)
        && a.toleration_seconds == b.toleration_seconds
}

/// Whether `ss` tolerates every taint `t` tolerates (Kubernetes' `IsSuperset`).
pub fn toleration_covers(ss: &Toleration, t: &Toleration) -> bool {
    if same_toleration(ss, t) {
        return true;
    }
    let s = |v: &Option<String>| v.clone().unwrap_or_default();
    let (ss_key, ss_op, ss_effect) = (s(&ss.key), s(&ss.operator), s(&ss.effect));
    // An empty key with Exists matches every key.
    if s(&t.key) != ss_key && (!ss_key.is_empty() || ss_op != "Exists") {
        return false;
    }
    // An empty effect matches every effect.
    if s(&t.effect) != ss_effect && !ss_effect.is_empty() {
        return false;
    }
    if ss_effect == "NoExecute"
        && let Some(limit) = ss.toleration_seconds
        && t.toleration_seconds.is_none_or(|secs| secs > limit)
    {
        return false;
    }
    match ss_op.as_str() {
        "" | "Equal" => s(&t.operator) == "Equal" && s(&t.value) == s(&ss.value),
        "Exists" => true,
        _ => false,
    }
}

/// The pod's tolerations followed by the class's, keeping only those no other one covers
/// (of two equal ones, the first stays), as Kubernetes' toleration merge.
pub fn merge_tolerations(pod: &[Toleration], class: &[Toleration]) -> Vec<Toleration> {
    let all: Vec<&Toleration> = pod.iter().chain(class.iter()).collect();
    let mut merged: Vec<Toleration> = Vec::new();
    for (i, t) in all.iter().enumerate() {
        if merged.iter().any(|m| toleration_covers(m, t)) {
            continue;
        }
        if all[i + 1..].iter().any(|later| !same_toleration(t, later) && toleration_covers(later, t)) {
            continue;
        }
        merged.push((*t).clone());
    }
    merged
}

/// The taint a node lifecycle controller puts on a node whose Ready condition is not True.
pub const TAINT_NODE_NOT_READY: &str = "node.kubernetes.io/not-ready";
/// The taint a node lifecycle controller puts on a node whose Ready condition is Unknown.
pub const TAINT_NODE_UNREACHABLE: &str = "node.kubernetes.io/unreachable";

/// The DefaultTolerationSeconds plugin's settings: kube-apiserver's
/// `--default-not-ready-toleration-seconds` and `--default-unreachable-toleration-seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefaultTolerationSeconds {
    pub not_ready: i64,
    pub unreachable: i64,
}

impl Default for DefaultTolerationSeconds {
    fn default() -> Self {
        DefaultTolerationSeconds { not_ready: 300, unreachable: 300 }
    }
}

impl DefaultTolerationSeconds {
    /// The tolerations to append to a pod that has `tolerations`: `not-ready` and `unreachable`
    /// with effect NoExecute for the configured seconds, each unless a toleration already names
    /// that key (or no key) with effect NoExecute (or no effect). As the upstream plugin, the
    /// operator and value are not looked at.
    pub fn missing(&self, tolerations: &[Toleration]) -> Vec<Toleration> {
        let covers = |key: &str| {
            tolerations.iter().any(|t| {
                let (k, e) = (t.key.as_deref().unwrap_or(""), t.effect.as_deref().unwrap_or(""));
                (k == key || k.is_empty()) && (e == "NoExecute" || e.is_empty())
            })
        };
        [(TAINT_NODE_NOT_READY, self.not_ready), (TAINT_NODE_UNREACHABLE, self.unreachable)]
            .into_iter()
            .filter(|(key, _)| !covers(key))
            .map(|(key, seconds)| Toleration {
                key: Some(key.into()),
                operator: Some("Exists".into()),
                effect: Some("NoExecute".into()),
                toleration_seconds: Some(seconds),
                value: None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::api::node::v1::{Overhead, Scheduling};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use std::collections::BTreeMap;

    fn pod(class: Option<&str>) -> Pod {
        Pod {
            spec: Some(PodSpec { runtime_class_name: class.map(Into::into), ..Default::default() }),
            ..Default::default()
        }
    }

    fn class(name: &str) -> RuntimeClass {
        RuntimeClass {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            handler: "runc".into(),
            ..Default::default()
        }
    }

    fn res(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
        pairs.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect()
    }

    fn tol(key: &str, effect: &str, value: &str) -> Toleration {
        Toleration {
            key: Some(key.into()),
            operator: Some("Equal".into()),
            value: Some(value.into()),
            effect: Some(effect.into()),
            ..Default::default()
        }
    }

    #[test]
    fn pod_without_class_is_admitted_unchanged() {
        let mut p = pod(None);
        let before = p.clone();
        assert_eq!(admit_runtime_class(&mut p, None), Ok(()));
        assert_eq!(p, before);
    }

    #[test]
    fn unknown_class_is_rejected_with_kubernetes_message() {
        let mut p = pod(Some("gvisor"));
        assert_eq!(admit_runtime_class(&mut p, None), Err("pod rejected: RuntimeClass \"gvisor\" not found".into()));
    }

    #[test]
    fn class_overhead_is_copied_into_the_pod() {
        let mut c = class("kata");
        c.overhead = Some(Overhead { pod_fixed: Some(res(&[("cpu", "250m"), ("memory", "120Mi")])) });
        let mut p = pod(Some("kata"));
        admit_runtime_class(&mut p, Some(&c)).unwrap();
        assert_eq!(p.spec.unwrap().overhead, Some(res(&[("cpu", "250m"), ("memory", "120Mi")])));
    }

    #[test]
    fn matching_pod_overhead_is_accepted_even_in_other_units() {
        let mut c = class("kata");
        c.overhead = Some(Overhead { pod_fixed: Some(res(&[("cpu", "1")])) });
        let mut p = pod(Some("kata"));
        p.spec.as_mut().unwrap().overhead = Some(res(&[("cpu", "1000m")]));
        assert_eq!(admit_runtime_class(&mut p, Some(&c)), Ok(()));
    }

    #[test]
    fn differing_pod_overhead_is_rejected() {
        let mut c = class("kata");
        c.overhead = Some(Overhead { pod_fixed: Some(res(&[("cpu", "250m")])) });
        let mut p = pod(Some("kata"));
        p.spec.as_mut().unwrap().overhead = Some(res(&[("cpu", "100m")]));
        assert_eq!(
            admit_runtime_class(&mut p, Some(&c)),
            Err("pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead".into())
        );
    }

    #[test]
    fn pod_overhead_without_class_overhead_is_rejected() {
        let c = class("runc");
        let mut p = pod(Some("runc"));
        p.spec.as_mut().unwrap().overhead = Some(res(&[("cpu", "100m")]));
        let want =
            Err("pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead".to_string());
        assert_eq!(admit_runtime_class(&mut p, Some(&c)), want);
        let mut classless = pod(None);
        classless.spec.as_mut().unwrap().overhead = Some(res(&[("cpu", "100m")]));
        assert_eq!(admit_runtime_class(&mut classless, None), want);
    }

    #[test]
    fn node_selector_is_merged_key_by_key() {
        let mut c = class("arm");
        c.scheduling = Some(Scheduling {
            node_selector: Some([("arch".to_string(), "arm64".to_string())].into()),
            tolerations: None,
        });
        let mut p = pod(Some("arm"));
        p.spec.as_mut().unwrap().node_selector = Some([("zone".to_string(), "a".to_string())].into());
        admit_runtime_class(&mut p, Some(&c)).unwrap();
        let sel = p.spec.unwrap().node_selector.unwrap();
        assert_eq!(sel.get("arch").map(String::as_str), Some("arm64"));
        assert_eq!(sel.get("zone").map(String::as_str), Some("a"));
    }

    #[test]
    fn conflicting_node_selector_is_rejected_with_kubernetes_message() {
        let mut c = class("arm");
        c.scheduling = Some(Scheduling {
            node_selector: Some([("arch".to_string(), "arm64".to_string())].into()),
            tolerations: None,
        });
        let mut p = pod(Some("arm"));
        p.spec.as_mut().unwrap().node_selector = Some([("arch".to_string(), "amd64".to_string())].into());
        assert_eq!(
            admit_runtime_class(&mut p, Some(&c)),
            Err("conflict: runtimeClass.scheduling.nodeSelector[arch] = arm64; pod.spec.nodeSelector[arch] = amd64"
                .into())
        );
    }

    #[test]
    fn tolerations_are_unioned_and_covered_ones_dropped() {
        let mut c = class("gpu");
        let mut any_gpu = tol("gpu", "NoSchedule", "");
        any_gpu.operator = Some("Exists".into());
        c.scheduling = Some(Scheduling {
            node_selector: None,
            tolerations: Some(vec![any_gpu.clone(), tol("x", "NoExecute", "1"), tol("own", "NoSchedule", "1")]),
        });
        let mut p = pod(Some("gpu"));
        p.spec.as_mut().unwrap().tolerations = Some(vec![tol("gpu", "NoSchedule", "a"), tol("own", "NoSchedule", "1")]);
        admit_runtime_class(&mut p, Some(&c)).unwrap();
        let got = p.spec.unwrap().tolerations.unwrap();
        // The pod's gpu=a is covered by the class's gpu Exists; own=1 appears once.
        assert_eq!(got, vec![tol("own", "NoSchedule", "1"), any_gpu, tol("x", "NoExecute", "1")]);
    }

    #[test]
    fn covering_respects_effects_and_toleration_seconds() {
        let mut wildcard = Toleration { operator: Some("Exists".into()), ..Default::default() };
        assert!(toleration_covers(&wildcard, &tol("k", "NoExecute", "v")));
        wildcard.effect = Some("NoSchedule".into());
        assert!(!toleration_covers(&wildcard, &tol("k", "NoExecute", "v")));
        let mut short = tol("k", "NoExecute", "v");
        short.toleration_seconds = Some(10);
        let mut long = short.clone();
        long.toleration_seconds = Some(100);
        assert!(!toleration_covers(&short, &long));
        assert!(toleration_covers(&long, &short));
        assert_eq!(merge_tolerations(&[short.clone()], &[long.clone()]), vec![long]);
    }

    #[test]
    fn default_class_is_the_newest_annotated_one() {
        let mk = |name: &str, secs: i64, default: bool| {
            let mut c = class(name);
            c.metadata.creation_timestamp = Some(Time(jiff::Timestamp::from_second(secs).unwrap()));
            if default {
                c.metadata.annotations = Some([(DEFAULT_CLASS_ANNOTATION.to_string(), "true".to_string())].into());
            }
            c
        };
        let classes = vec![mk("old", 10, true), mk("newest-plain", 99, false), mk("new", 20, true)];
        assert_eq!(default_runtime_class(&classes).unwrap().metadata.name.as_deref(), Some("new"));
        let tie = vec![mk("b", 20, true), mk("a", 20, true)];
        assert_eq!(default_runtime_class(&tie).unwrap().metadata.name.as_deref(), Some("a"));
        assert!(default_runtime_class(&[mk("x", 1, false)]).is_none());
    }

    fn exists(key: &str, effect: &str) -> Toleration {
        Toleration {
            key: (!key.is_empty()).then(|| key.into()),
            operator: Some("Exists".into()),
            effect: (!effect.is_empty()).then(|| effect.into()),
            ..Default::default()
        }
    }

    fn defaulted(key: &str, seconds: i64) -> Toleration {
        Toleration { toleration_seconds: Some(seconds), ..exists(key, "NoExecute") }
    }

    #[test]
    fn pods_without_node_condition_tolerations_get_both_for_five_minutes() {
        let added = DefaultTolerationSeconds::default().missing(&[tol("gpu", "NoSchedule", "a")]);
        assert_eq!(added, vec![defaulted(TAINT_NODE_NOT_READY, 300), defaulted(TAINT_NODE_UNREACHABLE, 300)]);
        let configured = DefaultTolerationSeconds { not_ready: 60, unreachable: 0 };
        assert_eq!(
            configured.missing(&[]),
            vec![defaulted(TAINT_NODE_NOT_READY, 60), defaulted(TAINT_NODE_UNREACHABLE, 0)]
        );
    }

    #[test]
    fn a_toleration_of_the_key_with_no_execute_or_any_effect_is_kept_alone() {
        let d = DefaultTolerationSeconds::default();
        let mut own = defaulted(TAINT_NODE_NOT_READY, 10);
        assert_eq!(d.missing(&[own.clone()]), vec![defaulted(TAINT_NODE_UNREACHABLE, 300)]);
        own.effect = None;
        assert_eq!(d.missing(&[own.clone()]), vec![defaulted(TAINT_NODE_UNREACHABLE, 300)]);
        // Only NoSchedule: not a toleration of the NoExecute taint.
        own.effect = Some("NoSchedule".into());
        assert_eq!(d.missing(&[own]).len(), 2);
        // As upstream, the operator is not looked at: an Equal toleration counts too.
        assert_eq!(
            d.missing(&[tol(TAINT_NODE_UNREACHABLE, "NoExecute", "x")]),
            vec![defaulted(TAINT_NODE_NOT_READY, 300)]
        );
    }

    #[test]
    fn an_empty_key_tolerates_both_taints() {
        let d = DefaultTolerationSeconds::default();
        assert!(d.missing(&[exists("", "")]).is_empty());
        assert!(d.missing(&[exists("", "NoExecute")]).is_empty());
        assert_eq!(d.missing(&[exists("", "NoSchedule")]).len(), 2);
    }
}
