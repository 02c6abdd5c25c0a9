//! Pod predicates the controllers share (active, ready, available) and the order in which a
//! ReplicaSet gives up its pods when it scales down.
//!
//! The order is `controller.ActivePodsWithRanks`: unassigned before assigned, Pending before
//! Unknown before Running, not ready before ready, lower `controller.kubernetes.io/pod-deletion-cost`
//! first, pods doubled up on a node with more of their siblings first, ready for less time before
//! ready for longer, more restarts before fewer, newer before older. Kubernetes' default
//! `LogarithmicScaleDown` feature would treat ready and creation times within the same power of
//! two of age as equal and break ties by UID (randomly); berth keeps the exact comparison, so
//! the newest pod always goes first.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodCondition};

/// The annotation that lets users say which pods to delete first.
pub const POD_DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

/// Neither finished nor being deleted (`controller.IsPodActive`).
pub fn is_active(pod: &Pod) -> bool {
    !matches!(phase(pod), "Succeeded" | "Failed") && pod.metadata.deletion_timestamp.is_none()
}

pub fn ready_condition(pod: &Pod) -> Option<&PodCondition> {
    pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")
}

/// The Ready condition is True (`podutil.IsPodReady`).
pub fn is_ready(pod: &Pod) -> bool {
    ready_condition(pod).is_some_and(|c| c.status == "True")
}

/// When a ready pod has been ready since, if the condition says.
fn ready_since(pod: &Pod) -> Option<jiff::Timestamp> {
    ready_condition(pod).filter(|c| c.status == "True").and_then(|c| c.last_transition_time.as_ref()).map(|t| t.0)
}

/// Ready for more than `min_ready_seconds` (`podutil.IsPodAvailable`); a pod that is ready
/// without a transition time is available only when no minimum is asked for.
pub fn is_available(pod: &Pod, min_ready_seconds: i32, now: jiff::Timestamp) -> bool {
    if !is_ready(pod) {
        return false;
    }
    if min_ready_seconds <= 0 {
        return true;
    }
    ready_since(pod).is_some_and(|t| t + jiff::SignedDuration::from_secs(i64::from(min_ready_seconds)) < now)
}

/// How long until a ready pod that is not yet available becomes so; `None` for other pods.
pub fn available_in(pod: &Pod, min_ready_seconds: i32, now: jiff::Timestamp) -> Option<Duration> {
    if min_ready_seconds <= 0 || !is_ready(pod) || is_available(pod, min_ready_seconds, now) {
        return None;
    }
    let at = ready_since(pod)? + jiff::SignedDuration::from_secs(i64::from(min_ready_seconds));
    // Available strictly after `at`: one more second covers the API's whole-second times.
    let left = at.duration_since(now) + jiff::SignedDuration::from_secs(1);
    Some(left.try_into().unwrap_or(Duration::ZERO))
}

fn node(pod: &Pod) -> &str {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or("")
}

fn phase_ordinal(pod: &Pod) -> u8 {
    match phase(pod) {
        "Unknown" => 1,
        "Running" => 2,
        _ => 0,
    }
}

fn deletion_cost(pod: &Pod) -> i32 {
    pod.metadata.annotations.as_ref().and_then(|a| a.get(POD_DELETION_COST)).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The highest restart count of the regular containers, then of the sidecars.
fn max_restarts(pod: &Pod) -> (i32, i32) {
    let Some(status) = pod.status.as_ref() else { return (0, 0) };
    let regular = status.container_statuses.iter().flatten().map(|c| c.restart_count).max().unwrap_or(0);
    let sidecars: HashSet<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| c.name.as_str())
        .collect();
    let sidecar = status
        .init_container_statuses
        .iter()
        .flatten()
        .filter(|c| sidecars.contains(c.name.as_str()))
        .map(|c| c.restart_count)
        .max()
        .unwrap_or(0);
    (regular, sidecar)
}

/// Earlier of two optional times with a missing one first (`afterOrZero` reversed): the pod
/// whose time is missing or later compares as less valuable.
fn later_first(a: Option<jiff::Timestamp>, b: Option<jiff::Timestamp>) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(x), Some(y)) => y.cmp(&x),
    }
}

/// Compares two pods for deletion: `Less` means `a` goes first. `rank_*` is the number of active
/// related pods on the same node.
pub fn deletion_order(a: &Pod, rank_a: usize, b: &Pod, rank_b: usize) -> Ordering {
    // 1. Unassigned < assigned.
    let (na, nb) = (node(a), node(b));
    if na != nb && (na.is_empty() || nb.is_empty()) {
        return if na.is_empty() { Ordering::Less } else { Ordering::Greater };
    }
    // 2. Pending < Unknown < Running.
    let by_phase = phase_ordinal(a).cmp(&phase_ordinal(b));
    if by_phase != Ordering::Equal {
        return by_phase;
    }
    // 3. Not ready < ready.
    let (ra, rb) = (is_ready(a), is_ready(b));
    if ra != rb {
        return if ra { Ordering::Greater } else { Ordering::Less };
    }
    // 4. Lower deletion cost < higher.
    let by_cost = deletion_cost(a).cmp(&deletion_cost(b));
    if by_cost != Ordering::Equal {
        return by_cost;
    }
    // 5. Doubled up with more siblings < fewer.
    if rank_a != rank_b {
        return rank_b.cmp(&rank_a);
    }
    // 6. Ready for less time < longer.
    if ra && rb {
        let by_ready = later_first(ready_since(a), ready_since(b));
        if by_ready != Ordering::Equal {
            return by_ready;
        }
    }
    // 7. More restarts < fewer.
    let (ma, mb) = (max_restarts(a), max_restarts(b));
    if ma != mb {
        return mb.cmp(&ma);
    }
    // 8. Newer < older.
    later_first(
        a.metadata.creation_timestamp.as_ref().map(|t| t.0),
        b.metadata.creation_timestamp.as_ref().map(|t| t.0),
    )
}

/// The `diff` least valuable of `pods` (`getPodsToDelete`), ranking pods doubled up with
/// `related` pods (the active pods of every ReplicaSet with the same controller) first.
pub fn pods_to_delete<'a>(pods: &[&'a Pod], related: &[&Pod], diff: usize) -> Vec<&'a Pod> {
    let mut on_node: HashMap<&str, usize> = HashMap::new();
    for p in related.iter().filter(|p| is_active(p)) {
        *on_node.entry(node(p)).or_default() += 1;
    }
    let mut ranked: Vec<(&Pod, usize)> =
        pods.iter().map(|p| (*p, on_node.get(node(p)).copied().unwrap_or(0))).collect();
    if diff < ranked.len() {
        ranked.sort_by(|(a, ra), (b, rb)| deletion_order(a, *ra, b, *rb));
    }
    ranked.into_iter().take(diff).map(|(p, _)| p).collect()
}

#[cfg(test)]
pub(crate) mod testing {
    use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    pub fn at(secs: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    /// A pod created at `created`, Pending and not ready.
    pub fn pod(name: &str, created: i64) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                creation_timestamp: Some(Time(at(created))),
                labels: Some([("app".to_string(), "web".to_string())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec::default()),
            status: Some(PodStatus { phase: Some("Pending".into()), ..Default::default() }),
        }
    }

    pub fn on(mut p: Pod, node: &str) -> Pod {
        p.spec.get_or_insert_with(Default::default).node_name = Some(node.into());
        p
    }

    pub fn running(mut p: Pod) -> Pod {
        p.status.get_or_insert_with(Default::default).phase = Some("Running".into());
        p
    }

    /// Running and Ready since `since`.
    pub fn ready(p: Pod, since: i64) -> Pod {
        let mut p = running(p);
        let status = p.status.get_or_insert_with(Default::default);
        status.conditions = Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            last_transition_time: Some(Time(at(since))),
            ..Default::default()
        }]);
        p
    }

    pub fn restarts(mut p: Pod, n: i32) -> Pod {
        p.status.get_or_insert_with(Default::default).container_statuses =
            Some(vec![ContainerStatus { name: "app".into(), restart_count: n, ..Default::default() }]);
        p
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    fn names(pods: &[&Pod]) -> Vec<String> {
        pods.iter().map(|p| p.metadata.name.clone().unwrap()).collect()
    }

    fn first_deleted(pods: &[Pod]) -> String {
        let refs: Vec<&Pod> = pods.iter().collect();
        names(&pods_to_delete(&refs, &[], 1))[0].clone()
    }

    #[test]
    fn unassigned_pods_go_before_assigned_ones() {
        let assigned = ready(on(pod("assigned", 0), "n1"), 0);
        let unassigned = ready(pod("unassigned", 0), 0);
        assert_eq!(first_deleted(&[assigned, unassigned]), "unassigned");
    }

    #[test]
    fn pending_goes_before_unknown_before_running() {
        let mut unknown = on(pod("unknown", 0), "n1");
        unknown.status.as_mut().unwrap().phase = Some("Unknown".into());
        let pending = on(pod("pending", 0), "n1");
        let run = running(on(pod("running", 0), "n1"));
        assert_eq!(first_deleted(&[run.clone(), unknown.clone(), pending]), "pending");
        assert_eq!(first_deleted(&[run, unknown]), "unknown");
    }

    #[test]
    fn not_ready_goes_before_ready() {
        let not_ready = running(on(pod("not-ready", 0), "n1"));
        let ready_pod = ready(on(pod("ready", 0), "n1"), 5);
        assert_eq!(first_deleted(&[ready_pod, not_ready]), "not-ready");
    }

    #[test]
    fn a_lower_deletion_cost_goes_first() {
        let mut cheap = ready(on(pod("cheap", 0), "n1"), 0);
        cheap.metadata.annotations = Some([(POD_DELETION_COST.to_string(), "-5".to_string())].into());
        let dear = ready(on(pod("dear", 10), "n1"), 10);
        assert_eq!(first_deleted(&[dear, cheap]), "cheap");
    }

    #[test]
    fn a_pod_doubled_up_with_siblings_goes_first() {
        let crowded = ready(on(pod("crowded", 0), "n1"), 0);
        let alone = ready(on(pod("alone", 10), "n2"), 10);
        let sibling = ready(on(pod("sibling", 0), "n1"), 0);
        let pods = [&crowded, &alone];
        let related = [&crowded, &alone, &sibling];
        assert_eq!(names(&pods_to_delete(&pods, &related, 1)), vec!["crowded"]);
    }

    #[test]
    fn ready_for_less_time_goes_first() {
        let long = ready(on(pod("long", 0), "n1"), 10);
        let short = ready(on(pod("short", 0), "n1"), 100);
        assert_eq!(first_deleted(&[long, short]), "short");
    }

    #[test]
    fn more_restarts_go_first() {
        let flaky = restarts(ready(on(pod("flaky", 0), "n1"), 10), 4);
        let steady = restarts(ready(on(pod("steady", 0), "n1"), 10), 1);
        assert_eq!(first_deleted(&[steady, flaky]), "flaky");
    }

    #[test]
    fn newer_goes_before_older_and_a_missing_creation_time_first() {
        let old = pod("old", 0);
        let new = pod("new", 50);
        assert_eq!(first_deleted(&[old.clone(), new]), "new");
        let mut timeless = pod("timeless", 0);
        timeless.metadata.creation_timestamp = None;
        assert_eq!(first_deleted(&[old, timeless]), "timeless");
    }

    #[test]
    fn the_whole_order_picks_the_least_valuable_pods() {
        let pods = [
            ready(on(pod("keep-oldest-ready", 0), "n1"), 10),
            ready(on(pod("ready-recently", 5), "n2"), 300),
            running(on(pod("running-not-ready", 1), "n3")),
            pod("unscheduled", 2),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        assert_eq!(names(&pods_to_delete(&refs, &[], 3)), vec!["unscheduled", "running-not-ready", "ready-recently"]);
        assert_eq!(pods_to_delete(&refs, &[], 4).len(), 4);
    }

    #[test]
    fn active_excludes_finished_and_deleting_pods() {
        let mut done = pod("done", 0);
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let mut failed = pod("failed", 0);
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        let mut going = pod("going", 0);
        going.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(1)));
        assert!(is_active(&pod("p", 0)));
        assert!(!is_active(&done) && !is_active(&failed) && !is_active(&going));
    }

    #[test]
    fn a_pod_is_available_only_after_min_ready_seconds() {
        let p = ready(pod("p", 0), 100);
        assert!(is_available(&p, 0, at(100)));
        assert!(!is_available(&p, 10, at(110)), "exactly at the minimum it is not yet available");
        assert!(is_available(&p, 10, at(111)));
        assert!(!is_available(&pod("p", 0), 0, at(500)), "a pod that is not ready is never available");
        assert_eq!(available_in(&p, 10, at(105)), Some(Duration::from_secs(6)));
        assert_eq!(available_in(&p, 10, at(111)), None);
        assert_eq!(available_in(&p, 0, at(100)), None);
    }

    #[test]
    fn a_trimmed_pod_ranks_and_counts_as_before() {
        let mut p = restarts(ready(on(pod("p", 0), "n1"), 10), 2);
        p.spec.as_mut().unwrap().containers = vec![k8s_openapi::api::core::v1::Container {
            name: "app".into(),
            image: Some("x".into()),
            ..Default::default()
        }];
        let before = p.clone();
        crate::pod_cache::trim(&mut p);
        assert!(p.spec.as_ref().unwrap().containers.is_empty());
        assert_eq!(node(&p), "n1");
        assert_eq!(max_restarts(&p), max_restarts(&before));
        assert_eq!(is_available(&p, 5, at(100)), is_available(&before, 5, at(100)));
        assert_eq!(deletion_order(&p, 0, &before, 0), Ordering::Equal);
    }
}
