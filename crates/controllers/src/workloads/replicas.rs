//! What a ReplicaSet decides about its pods: which it owns, adopts and releases, how many to
//! create or delete and in which batches, the pods it creates, and its status. A
//! ReplicationController decides the same, through [`Replicated`].

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use berth_api::selector::LabelSelector;
use k8s_openapi::api::apps::v1::{ReplicaSetCondition, ReplicaSetStatus};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::replicated::Replicated;
use super::{api_time, controller_of, controller_ref, pods};

/// At most this many pods are created or deleted in one sync (`--concurrent-...` burstReplicas).
pub const BURST_REPLICAS: usize = 500;
/// The first batch of a slow start (`controller.SlowStartInitialBatchSize`).
pub const SLOW_START_INITIAL_BATCH: usize = 1;
/// The ReplicaSet condition set when pods cannot be created or deleted.
pub const REPLICA_FAILURE: &str = "ReplicaFailure";

/// The pods of a sync, sorted out by ownership (`ControllerRefManager.ClaimPods`).
#[derive(Debug, Default, PartialEq)]
pub struct Claim<'a> {
    /// Controlled by the ReplicaSet and still matching its selector.
    pub owned: Vec<&'a Pod>,
    /// Orphans that match: to adopt.
    pub adopt: Vec<&'a Pod>,
    /// Controlled by the ReplicaSet but no longer matching: to release.
    pub release: Vec<&'a Pod>,
}

/// Sorts the active pods of the ReplicaSet's namespace. A ReplicaSet being deleted adopts nothing
/// and releases nothing; pods being deleted are never adopted.
pub fn claim<'a, K: Replicated>(rs: &K, selector: &LabelSelector, pods: &[&'a Pod]) -> Claim<'a> {
    let uid = rs.meta().uid.as_deref().unwrap_or("");
    let rs_deleting = rs.meta().deletion_timestamp.is_some();
    let empty = BTreeMap::new();
    let mut out = Claim::default();
    for pod in pods {
        let matches = selector.matches(pod.metadata.labels.as_ref().unwrap_or(&empty));
        match controller_of(&pod.metadata) {
            Some(c) if c.uid == uid => {
                if matches {
                    out.owned.push(pod);
                } else if !rs_deleting {
                    out.release.push(pod);
                }
            }
            Some(_) => {}
            None => {
                if matches && !rs_deleting && pod.metadata.deletion_timestamp.is_none() {
                    out.adopt.push(pod);
                }
            }
        }
    }
    out
}

/// The batch sizes of a slow start of `count` calls: 1, 2, 4, ... until all are made
/// (`slowStartBatch`); a batch starts only when the previous one succeeded entirely.
pub fn slow_start_batches(count: usize, initial: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut remaining = count;
    let mut batch = remaining.min(initial.max(1));
    while batch > 0 {
        out.push(batch);
        remaining -= batch;
        batch = (2 * batch).min(remaining);
    }
    out
}

/// Makes `count` calls of `f` in slow-start batches, each batch concurrently; returns how many
/// succeeded and the first error, after which no further batch is started.
pub async fn slow_start<F, Fut, E>(count: usize, mut f: F) -> (usize, Option<E>)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let mut successes = 0;
    for batch in slow_start_batches(count, SLOW_START_INITIAL_BATCH) {
        let results = futures::future::join_all((0..batch).map(|_| f())).await;
        let mut first_error = None;
        for r in results {
            match r {
                Ok(()) => successes += 1,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if first_error.is_some() {
            return (successes, first_error);
        }
    }
    (successes, None)
}

/// The pod the ReplicaSet creates from its template (`GetPodFromTemplate`): the template's
/// labels, annotations, finalizers and spec, named by the server from `<rs>-`, controlled by
/// the ReplicaSet (or ReplicationController).
pub fn pod_from_template<K: Replicated>(rs: &K) -> Pod {
    let template: PodTemplateSpec = rs.template().cloned().unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    let owner = rs.meta();
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", owner.name.as_deref().unwrap_or(""))),
            namespace: owner.namespace.clone(),
            labels: meta.labels,
            annotations: meta.annotations,
            finalizers: meta.finalizers,
            owner_references: Some(vec![controller_ref(&K::api_version(&()), &K::kind(&()), owner)]),
            ..Default::default()
        },
        spec: template.spec,
        status: None,
    }
}

/// The status of a ReplicaSet from its active, claimed pods (`calculateStatus`); `failure` is
/// the message of the error creating or deleting pods in this sync, if any.
pub fn status<K: Replicated>(rs: &K, active: &[&Pod], failure: Option<&str>, now: jiff::Timestamp) -> ReplicaSetStatus {
    let mut status = rs.replica_status().unwrap_or_default();
    let empty = BTreeMap::new();
    let template_labels = rs.template().and_then(|t| t.metadata.as_ref()).and_then(|m| m.labels.as_ref());
    let template_labels = template_labels.unwrap_or(&empty);
    let min_ready = rs.min_ready_seconds();
    let (mut fully_labeled, mut ready, mut available) = (0, 0, 0);
    for pod in active {
        let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
        if template_labels.iter().all(|(k, v)| labels.get(k) == Some(v)) {
            fully_labeled += 1;
        }
        if pods::is_ready(pod) {
            ready += 1;
            if pods::is_available(pod, min_ready, now) {
                available += 1;
            }
        }
    }
    let existing = status.conditions.iter().flatten().any(|c| c.type_ == REPLICA_FAILURE);
    match failure {
        Some(message) if !existing => {
            let diff = active.len() as i64 - i64::from(rs.replicas());
            let reason = match diff.cmp(&0) {
                std::cmp::Ordering::Less => "FailedCreate",
                std::cmp::Ordering::Greater => "FailedDelete",
                std::cmp::Ordering::Equal => "",
            };
            status.conditions.get_or_insert_with(Vec::new).push(ReplicaSetCondition {
                type_: REPLICA_FAILURE.into(),
                status: "True".into(),
                reason: Some(reason.into()).filter(|r: &String| !r.is_empty()),
                message: Some(message.into()),
                last_transition_time: Some(api_time(now)),
            });
        }
        None if existing => {
            status.conditions.get_or_insert_with(Vec::new).retain(|c| c.type_ != REPLICA_FAILURE);
        }
        _ => {}
    }
    if status.conditions.as_ref().is_some_and(|c| c.is_empty()) {
        status.conditions = None;
    }
    // Zero counts are left out, as Go's `omitempty` writes them.
    let nonzero = |n: i32| (n != 0).then_some(n);
    status.replicas = active.len() as i32;
    status.fully_labeled_replicas = nonzero(fully_labeled);
    status.ready_replicas = nonzero(ready);
    status.available_replicas = nonzero(available);
    status
}

/// Whether `new` differs from the stored status in what `updateReplicaSetStatus` compares
/// (counts, conditions, and an observed generation behind the object's).
pub fn status_changed<K: Replicated>(rs: &K, new: &ReplicaSetStatus) -> bool {
    let old = rs.replica_status().unwrap_or_default();
    let n = |v: Option<i32>| v.unwrap_or(0);
    old.replicas != new.replicas
        || n(old.fully_labeled_replicas) != n(new.fully_labeled_replicas)
        || n(old.ready_replicas) != n(new.ready_replicas)
        || n(old.available_replicas) != n(new.available_replicas)
        || rs.meta().generation.unwrap_or(0) != old.observed_generation.unwrap_or(0)
        || old.conditions.unwrap_or_default() != new.conditions.clone().unwrap_or_default()
}

/// When to look again so that pods that are ready but not yet available for `minReadySeconds`
/// are counted available (the upstream controller requeues after `minReadySeconds`).
pub fn next_availability_check<K: Replicated>(rs: &K, active: &[&Pod], now: jiff::Timestamp) -> Option<Duration> {
    let min_ready = rs.min_ready_seconds();
    active.iter().filter_map(|p| pods::available_in(p, min_ready, now)).min()
}

#[cfg(test)]
mod tests {
    use super::super::pods::testing::*;
    use super::*;
    use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector as K8sSelector, OwnerReference, Time};

    fn rs(replicas: i32) -> ReplicaSet {
        ReplicaSet {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                uid: Some("rs-uid".into()),
                generation: Some(1),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(replicas),
                selector: K8sSelector {
                    match_labels: Some([("app".to_string(), "web".to_string())].into()),
                    ..Default::default()
                },
                template: Some(PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(
                            [("app".to_string(), "web".to_string()), ("tier".to_string(), "fe".to_string())].into(),
                        ),
                        annotations: Some([("a".to_string(), "b".to_string())].into()),
                        ..Default::default()
                    }),
                    spec: Some(Default::default()),
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn owned_by(mut p: Pod, uid: &str) -> Pod {
        p.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: "x".into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        p
    }

    fn selector(rs: &ReplicaSet) -> LabelSelector {
        LabelSelector::from_k8s(&rs.spec.as_ref().unwrap().selector).unwrap()
    }

    #[test]
    fn slow_start_doubles_its_batches_up_to_the_count() {
        assert_eq!(slow_start_batches(0, 1), Vec::<usize>::new());
        assert_eq!(slow_start_batches(1, 1), vec![1]);
        assert_eq!(slow_start_batches(10, 1), vec![1, 2, 4, 3]);
        assert_eq!(slow_start_batches(15, 1), vec![1, 2, 4, 8]);
        assert_eq!(slow_start_batches(500, 1).iter().sum::<usize>(), 500);
    }

    #[tokio::test]
    async fn slow_start_stops_after_the_first_failing_batch() {
        let calls = std::sync::atomic::AtomicUsize::new(0);
        // Calls 1..=3 succeed (batches 1 and 2), the 4th fails (in the batch of 4).
        let (ok, err) = slow_start(10, || {
            let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            async move { if n == 4 { Err("quota") } else { Ok(()) } }
        })
        .await;
        assert_eq!((ok, err), (6, Some("quota")), "the failing batch still runs to its end");
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 7);
        let (ok, err) = slow_start(5, || async { Ok::<(), ()>(()) }).await;
        assert_eq!((ok, err), (5, None));
    }

    #[test]
    fn claim_keeps_owned_adopts_matching_orphans_and_releases_strays() {
        let rs = rs(3);
        let mine = owned_by(pod("mine", 0), "rs-uid");
        let mut stray = owned_by(pod("stray", 0), "rs-uid");
        stray.metadata.labels = Some([("app".to_string(), "other".to_string())].into());
        let orphan = pod("orphan", 0);
        let mut orphan_other = pod("orphan-other", 0);
        orphan_other.metadata.labels = None;
        let theirs = owned_by(pod("theirs", 0), "other-uid");
        let mut dying_orphan = pod("dying", 0);
        dying_orphan.metadata.deletion_timestamp = Some(Time(at(0)));
        let all = [&mine, &stray, &orphan, &orphan_other, &theirs, &dying_orphan];
        let c = claim(&rs, &selector(&rs), &all);
        assert_eq!(c.owned, vec![&mine]);
        assert_eq!(c.adopt, vec![&orphan]);
        assert_eq!(c.release, vec![&stray]);

        let mut deleting = rs.clone();
        deleting.metadata.deletion_timestamp = Some(Time(at(0)));
        let c = claim(&deleting, &selector(&rs), &all);
        assert_eq!((c.owned.len(), c.adopt.len(), c.release.len()), (1, 0, 0));
    }

    #[test]
    fn a_pod_from_the_template_is_controlled_by_the_replica_set_and_named_by_the_server() {
        let p = pod_from_template(&rs(1));
        assert_eq!(p.metadata.generate_name.as_deref(), Some("web-"));
        assert_eq!(p.metadata.name, None);
        assert_eq!(p.metadata.labels.as_ref().unwrap()["tier"], "fe");
        assert_eq!(p.metadata.annotations.as_ref().unwrap()["a"], "b");
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("ReplicaSet", "rs-uid"));
        assert_eq!((owner.controller, owner.block_owner_deletion), (Some(true), Some(true)));
    }

    #[test]
    fn a_replication_controller_claims_and_creates_pods_as_a_replica_set_does_under_its_own_kind() {
        let rc: k8s_openapi::api::core::v1::ReplicationController = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db", "namespace": "ns", "uid": "rc-uid"},
            "spec": {"replicas": 2, "selector": {"app": "web"},
                     "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": []}}},
        }))
        .unwrap();
        let p = pod_from_template(&rc);
        assert_eq!(p.metadata.generate_name.as_deref(), Some("db-"));
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.api_version.as_str(), owner.kind.as_str(), owner.uid.as_str()),
            ("v1", "ReplicationController", "rc-uid")
        );
        assert_eq!((owner.controller, owner.block_owner_deletion), (Some(true), Some(true)));

        let mine = owned_by(pod("mine", 0), "rc-uid");
        let orphan = pod("orphan", 0);
        let selector = rc.selector().unwrap();
        let c = claim(&rc, &selector, &[&mine, &orphan]);
        assert_eq!((c.owned, c.adopt), (vec![&mine], vec![&orphan]));
        let s = status(&rc, &[&mine], Some("quota"), at(0));
        assert_eq!(s.replicas, 1);
        assert_eq!(s.conditions.unwrap()[0].reason.as_deref(), Some("FailedCreate"), "one pod short of two");
    }

    #[test]
    fn status_counts_labeled_ready_and_available_pods() {
        let mut rs = rs(3);
        rs.spec.as_mut().unwrap().min_ready_seconds = Some(10);
        let mut labeled = ready(pod("a", 0), 0);
        labeled.metadata.labels.as_mut().unwrap().insert("tier".into(), "fe".into());
        let recent = ready(pod("b", 0), 95);
        let waiting = pod("c", 0);
        let s = status(&rs, &[&labeled, &recent, &waiting], None, at(100));
        assert_eq!(s.replicas, 3);
        assert_eq!(s.fully_labeled_replicas, Some(1));
        assert_eq!(s.ready_replicas, Some(2));
        assert_eq!(s.available_replicas, Some(1));
        assert_eq!(next_availability_check(&rs, &[&labeled, &recent, &waiting], at(100)), Some(Duration::from_secs(6)));
    }

    #[test]
    fn a_failure_sets_replica_failure_once_and_success_clears_it() {
        let mut rs = rs(3);
        let msg = "pods \"web-x\" is forbidden: pod rejected: RuntimeClass \"x\" not found";
        let s = status(&rs, &[], Some(msg), at(0));
        let c = &s.conditions.as_ref().unwrap()[0];
        assert_eq!((c.type_.as_str(), c.status.as_str()), ("ReplicaFailure", "True"));
        assert_eq!(c.reason.as_deref(), Some("FailedCreate"));
        assert_eq!(c.message.as_deref(), Some(msg));
        rs.status = Some(s.clone());
        // A second failure keeps the first condition as it was.
        let again = status(&rs, &[], Some("other"), at(50));
        assert_eq!(again.conditions, s.conditions);
        let cleared = status(&rs, &[], None, at(60));
        assert_eq!(cleared.conditions, None);
    }

    #[test]
    fn status_changes_are_detected_including_a_new_generation() {
        let mut rs = rs(1);
        let s = status(&rs, &[], None, at(0));
        assert!(status_changed(&rs, &s), "observedGeneration 0 is behind generation 1");
        let mut written = s.clone();
        written.observed_generation = Some(1);
        rs.status = Some(written);
        assert!(!status_changed(&rs, &s));
        rs.metadata.generation = Some(2);
        assert!(status_changed(&rs, &s));
    }
}
