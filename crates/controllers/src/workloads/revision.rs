//! A Deployment's revisions: the pod-template hash that names its ReplicaSets, template
//! equality ignoring that hash, and the annotations that record revisions, their history and
//! the replica counts a ReplicaSet was last scaled for.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::Value;

use super::{POD_TEMPLATE_HASH_LABEL, normalize};

/// The revision of a ReplicaSet (and of its Deployment).
pub const REVISION: &str = "deployment.kubernetes.io/revision";
/// The revisions a reused ReplicaSet had before, comma-separated.
pub const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
/// `spec.replicas` of the Deployment when the ReplicaSet was last scaled.
pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
/// `spec.replicas + maxSurge` of the Deployment when the ReplicaSet was last scaled.
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
/// The longest `revision-history` kept (`maxRevHistoryLengthInChars`).
pub const MAX_REVISION_HISTORY_CHARS: usize = 2000;

/// Deployment annotations that are not copied to its ReplicaSets (`annotationsToSkip`).
const NOT_COPIED: &[&str] = &[
    "kubectl.kubernetes.io/last-applied-configuration",
    REVISION,
    REVISION_HISTORY,
    DESIRED_REPLICAS,
    MAX_REPLICAS,
    "deprecated.deployment.rollback.to",
];

/// The characters of generated names (`rand.SafeEncodeString`'s alphabet: no vowels, no
/// look-alikes).
const SAFE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// The `pod-template-hash` of a template: FNV-32a over its canonical JSON (keys sorted, zero
/// values dropped) followed by the collision count as Kubernetes appends it (four bytes little
/// endian in an eight-byte buffer), its decimal digits mapped onto the safe alphabet.
///
/// The value differs from Kubernetes' for the same template: `controller.ComputeHash` hashes
/// Go's `spew` dump of the struct, which only Go can reproduce. Nothing depends on the two
/// agreeing; the hash only has to be stable for a template, and ReplicaSets are matched to
/// templates by content ([`equal_ignore_hash`]), not by hash.
pub fn pod_template_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let value = serde_json::to_value(template).unwrap_or(Value::Null);
    let canonical = normalize(&value, false).to_string();
    let mut h = fnv32a(0x811c_9dc5, canonical.as_bytes());
    if let Some(c) = collision_count {
        let mut buf = [0u8; 8];
        buf[..4].copy_from_slice(&(c as u32).to_le_bytes());
        h = fnv32a(h, &buf);
    }
    safe_encode(&h.to_string())
}

fn fnv32a(mut h: u32, bytes: &[u8]) -> u32 {
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// `rand.SafeEncodeString`: each byte mapped onto the safe alphabet.
pub fn safe_encode(s: &str) -> String {
    s.bytes().map(|b| SAFE_ALPHABET[usize::from(b) % SAFE_ALPHABET.len()] as char).collect()
}

/// Two templates are equal once the `pod-template-hash` label is taken out of both
/// (`EqualIgnoreHash`), compared as `apiequality.Semantic.DeepEqual` would.
pub fn equal_ignore_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    let strip = |t: &PodTemplateSpec| {
        let mut t = t.clone();
        if let Some(labels) = t.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
            labels.remove(POD_TEMPLATE_HASH_LABEL);
        }
        normalize(&serde_json::to_value(t).unwrap_or(Value::Null), false)
    };
    strip(a) == strip(b)
}

/// The revision recorded on an object; 0 when missing or not a number.
pub fn revision_of(annotations: Option<&BTreeMap<String, String>>) -> i64 {
    annotations.and_then(|a| a.get(REVISION)).and_then(|r| r.parse().ok()).unwrap_or(0)
}

pub fn max_revision<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> i64 {
    rss.into_iter().map(|rs| revision_of(rs.metadata.annotations.as_ref())).max().unwrap_or(0)
}

/// Copies the Deployment's annotations onto the ReplicaSet, except those kept apart
/// (`copyDeploymentAnnotationsToReplicaSet`); true if any changed.
fn copy_deployment_annotations(d: &Deployment, rs: &mut BTreeMap<String, String>) -> bool {
    let mut changed = false;
    for (k, v) in d.metadata.annotations.iter().flatten() {
        if NOT_COPIED.contains(&k.as_str()) || rs.get(k) == Some(v) {
            continue;
        }
        rs.insert(k.clone(), v.clone());
        changed = true;
    }
    changed
}

/// The annotations of the Deployment's new ReplicaSet (`SetNewReplicaSetAnnotations`): the
/// Deployment's annotations, the revision raised to `new_revision` (a reused ReplicaSet's
/// previous revision moves into `revision-history`), and for a ReplicaSet about to be created
/// the replica annotations. True if anything changed.
pub fn set_new_replica_set_annotations(
    d: &Deployment,
    rs: &mut ReplicaSet,
    new_revision: i64,
    exists: bool,
    max_surge: i32,
) -> bool {
    let annotations = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let mut changed = copy_deployment_annotations(d, annotations);
    let old = annotations.get(REVISION).cloned();
    let old_revision = match old.as_deref() {
        None | Some("") => 0,
        Some(s) => match s.parse::<i64>() {
            Ok(n) => n,
            // A revision that is not a number is left alone, as upstream does.
            Err(_) => return false,
        },
    };
    if old_revision < new_revision {
        annotations.insert(REVISION.into(), new_revision.to_string());
        changed = true;
        if let Some(old) = old.filter(|o| !o.is_empty()) {
            let history = annotations.get(REVISION_HISTORY).cloned().unwrap_or_default();
            if let Some(h) = append_history(&history, &old, MAX_REVISION_HISTORY_CHARS) {
                annotations.insert(REVISION_HISTORY.into(), h);
            }
        }
    }
    if !exists {
        let desired = super::rollout::replicas(d);
        if set_replicas_annotations(rs, desired, desired + max_surge) {
            changed = true;
        }
    }
    changed
}

/// `history` with `old` appended, dropping the oldest entries to stay within `limit`
/// characters; `None` if even `old` alone does not fit.
pub fn append_history(history: &str, old: &str, limit: usize) -> Option<String> {
    if history.is_empty() {
        return Some(old.to_string());
    }
    let entries: Vec<&str> = history.split(',').collect();
    let mut total = history.len() + old.len() + 1;
    let mut start = 0;
    while total > limit && start < entries.len() {
        total -= entries[start].len() + 1;
        start += 1;
    }
    if total > limit {
        return None;
    }
    let mut kept: Vec<&str> = entries[start..].to_vec();
    kept.push(old);
    Some(kept.join(","))
}

/// Whether the replica annotations differ from these values (`ReplicasAnnotationsNeedUpdate`).
pub fn replicas_annotations_need_update(rs: &ReplicaSet, desired: i32, max: i32) -> bool {
    let a = rs.metadata.annotations.as_ref();
    a.and_then(|a| a.get(DESIRED_REPLICAS)) != Some(&desired.to_string())
        || a.and_then(|a| a.get(MAX_REPLICAS)) != Some(&max.to_string())
}

/// Records the Deployment's size on the ReplicaSet (`SetReplicasAnnotations`); true if changed.
pub fn set_replicas_annotations(rs: &mut ReplicaSet, desired: i32, max: i32) -> bool {
    if !replicas_annotations_need_update(rs, desired, max) {
        return false;
    }
    let a = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    a.insert(DESIRED_REPLICAS.into(), desired.to_string());
    a.insert(MAX_REPLICAS.into(), max.to_string());
    true
}

/// `deployment.kubernetes.io/desired-replicas` of a ReplicaSet, if set and valid.
pub fn desired_replicas_annotation(rs: &ReplicaSet) -> Option<i32> {
    rs.metadata.annotations.as_ref()?.get(DESIRED_REPLICAS)?.parse().ok()
}

/// `deployment.kubernetes.io/max-replicas` of a ReplicaSet, if set and valid.
pub fn max_replicas_annotation(rs: &ReplicaSet) -> Option<i32> {
    rs.metadata.annotations.as_ref()?.get(MAX_REPLICAS)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DeploymentSpec;
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn template(image: &str) -> PodTemplateSpec {
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some([("app".to_string(), "web".to_string())].into()),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                containers: vec![Container { name: "app".into(), image: Some(image.into()), ..Default::default() }],
                ..Default::default()
            }),
        }
    }

    fn deployment(annotations: &[(&str, &str)]) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                name: Some("web".into()),
                annotations: Some(annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            spec: Some(DeploymentSpec { replicas: Some(3), template: template("a"), ..Default::default() }),
            status: None,
        }
    }

    fn rs_with(annotations: &[(&str, &str)]) -> ReplicaSet {
        ReplicaSet {
            metadata: ObjectMeta {
                annotations: Some(annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn fnv32a_matches_the_reference_vectors() {
        assert_eq!(fnv32a(0x811c_9dc5, b""), 0x811c_9dc5);
        assert_eq!(fnv32a(0x811c_9dc5, b"a"), 0xe40c_292c);
        assert_eq!(fnv32a(0x811c_9dc5, b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn safe_encode_maps_digits_onto_the_alphabet() {
        // '0' is byte 48, 48 % 27 = 21 → '4'; '9' is 57 % 27 = 3 → 'f'.
        assert_eq!(safe_encode("09"), "4f");
        assert!(safe_encode("1234567890").bytes().all(|b| SAFE_ALPHABET.contains(&b)));
    }

    #[test]
    fn the_hash_is_stable_and_changes_with_the_template_and_the_collision_count() {
        let a = pod_template_hash(&template("nginx:1"), None);
        assert_eq!(a, pod_template_hash(&template("nginx:1"), None));
        assert!(!a.is_empty() && a.len() <= 10, "{a}");
        assert!(a.bytes().all(|b| SAFE_ALPHABET.contains(&b)));
        assert_ne!(a, pod_template_hash(&template("nginx:2"), None));
        let c0 = pod_template_hash(&template("nginx:1"), Some(0));
        assert_ne!(a, c0, "a collision count of 0 is hashed too");
        assert_ne!(c0, pod_template_hash(&template("nginx:1"), Some(1)));
    }

    #[test]
    fn key_order_and_empty_fields_do_not_change_the_hash() {
        let mut t = template("nginx:1");
        t.metadata.as_mut().unwrap().annotations = Some(BTreeMap::new());
        assert_eq!(pod_template_hash(&t, None), pod_template_hash(&template("nginx:1"), None));
    }

    #[test]
    fn templates_are_equal_ignoring_the_hash_label() {
        let mut with_hash = template("nginx:1");
        with_hash
            .metadata
            .as_mut()
            .unwrap()
            .labels
            .as_mut()
            .unwrap()
            .insert(POD_TEMPLATE_HASH_LABEL.into(), "abc".into());
        assert!(equal_ignore_hash(&with_hash, &template("nginx:1")));
        assert!(!equal_ignore_hash(&with_hash, &template("nginx:2")));
        // Only the hash label goes: a template whose labels are just the hash equals one without labels.
        let mut only_hash = template("x");
        only_hash.metadata.as_mut().unwrap().labels =
            Some([(POD_TEMPLATE_HASH_LABEL.to_string(), "h".to_string())].into());
        let mut none = template("x");
        none.metadata.as_mut().unwrap().labels = None;
        assert!(equal_ignore_hash(&only_hash, &none));
    }

    #[test]
    fn a_new_replica_set_gets_the_next_revision_the_deployments_annotations_and_its_size() {
        let d = deployment(&[("kubernetes.io/change-cause", "v2"), (REVISION, "4"), ("team", "a")]);
        let mut rs = rs_with(&[]);
        assert!(set_new_replica_set_annotations(&d, &mut rs, 5, false, 1));
        let a = rs.metadata.annotations.unwrap();
        assert_eq!(a[REVISION], "5");
        assert_eq!(a["kubernetes.io/change-cause"], "v2");
        assert_eq!(a["team"], "a");
        assert_eq!((a[DESIRED_REPLICAS].as_str(), a[MAX_REPLICAS].as_str()), ("3", "4"));
        assert!(!a.contains_key(REVISION_HISTORY));
    }

    #[test]
    fn a_reused_replica_set_moves_its_old_revision_into_the_history() {
        let d = deployment(&[]);
        let mut rs = rs_with(&[(REVISION, "1")]);
        assert!(set_new_replica_set_annotations(&d, &mut rs, 3, true, 0));
        let a = rs.metadata.annotations.clone().unwrap();
        assert_eq!((a[REVISION].as_str(), a[REVISION_HISTORY].as_str()), ("3", "1"));
        assert!(!a.contains_key(DESIRED_REPLICAS), "an existing ReplicaSet keeps its replica annotations");
        assert!(set_new_replica_set_annotations(&d, &mut rs, 5, true, 0));
        assert_eq!(rs.metadata.annotations.as_ref().unwrap()[REVISION_HISTORY], "1,3");
        // Nothing to do when the revision is already the newest.
        assert!(!set_new_replica_set_annotations(&d, &mut rs, 5, true, 0));
        assert!(!set_new_replica_set_annotations(&d, &mut rs, 2, true, 0));
    }

    #[test]
    fn revision_history_drops_the_oldest_entries_beyond_the_limit() {
        assert_eq!(append_history("", "7", 10).as_deref(), Some("7"));
        assert_eq!(append_history("1,2,3", "4", 10).as_deref(), Some("1,2,3,4"));
        assert_eq!(append_history("1,2,3,4", "55", 8).as_deref(), Some("2,3,4,55"));
        assert_eq!(append_history("1", "123456789", 5), None);
    }

    #[test]
    fn revisions_are_read_leniently_and_the_maximum_found() {
        let rss =
            [rs_with(&[(REVISION, "3")]), rs_with(&[(REVISION, "x")]), rs_with(&[]), rs_with(&[(REVISION, "12")])];
        assert_eq!(max_revision(&rss), 12);
        assert_eq!(max_revision(&[]), 0);
    }

    #[test]
    fn replica_annotations_are_set_only_when_they_differ() {
        let mut rs = rs_with(&[]);
        assert!(replicas_annotations_need_update(&rs, 3, 4));
        assert!(set_replicas_annotations(&mut rs, 3, 4));
        assert!(!set_replicas_annotations(&mut rs, 3, 4));
        assert_eq!((desired_replicas_annotation(&rs), max_replicas_annotation(&rs)), (Some(3), Some(4)));
        assert!(set_replicas_annotations(&mut rs, 5, 6));
    }
}
