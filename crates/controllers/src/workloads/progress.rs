//! A Deployment's status: its counts, and the `Available`, `Progressing` and `ReplicaFailure`
//! conditions with the progress deadline, as `kubectl rollout status` reads them.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet};

use super::rollout::{self, max_unavailable, replicas};
use super::{api_time, replicas::REPLICA_FAILURE};

pub const AVAILABLE: &str = "Available";
pub const PROGRESSING: &str = "Progressing";

pub const MINIMUM_REPLICAS_AVAILABLE: &str = "MinimumReplicasAvailable";
pub const MINIMUM_REPLICAS_UNAVAILABLE: &str = "MinimumReplicasUnavailable";
pub const NEW_RS_CREATED: &str = "NewReplicaSetCreated";
pub const FOUND_NEW_RS: &str = "FoundNewReplicaSet";
pub const RS_UPDATED: &str = "ReplicaSetUpdated";
pub const NEW_RS_AVAILABLE: &str = "NewReplicaSetAvailable";
pub const TIMED_OUT: &str = "ProgressDeadlineExceeded";
pub const PAUSED: &str = "DeploymentPaused";
pub const RESUMED: &str = "DeploymentResumed";
pub const FAILED_RS_CREATE: &str = "ReplicaSetCreateError";

pub fn condition<'a>(status: &'a DeploymentStatus, type_: &str) -> Option<&'a DeploymentCondition> {
    status.conditions.iter().flatten().find(|c| c.type_ == type_)
}

/// A condition that changes now (`NewDeploymentCondition`).
pub fn new_condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    now: jiff::Timestamp,
) -> DeploymentCondition {
    DeploymentCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_update_time: Some(api_time(now)),
        last_transition_time: Some(api_time(now)),
    }
}

/// Sets a condition unless one with the same status and reason is there; the transition time
/// is kept when only the reason changes (`SetDeploymentCondition`).
pub fn set_condition(status: &mut DeploymentStatus, mut c: DeploymentCondition) {
    if let Some(current) = condition(status, &c.type_) {
        if current.status == c.status && current.reason == c.reason {
            return;
        }
        if current.status == c.status {
            c.last_transition_time = current.last_transition_time.clone();
        }
    }
    remove_condition(status, &c.type_);
    status.conditions.get_or_insert_with(Vec::new).push(c);
}

pub fn remove_condition(status: &mut DeploymentStatus, type_: &str) {
    if let Some(conds) = status.conditions.as_mut() {
        conds.retain(|c| c.type_ != type_);
        if conds.is_empty() {
            status.conditions = None;
        }
    }
}

/// `progressDeadlineSeconds` is set and not "never" (`math.MaxInt32`).
pub fn has_progress_deadline(d: &Deployment) -> bool {
    d.spec.as_ref().and_then(|s| s.progress_deadline_seconds).is_some_and(|p| p != i32::MAX)
}

fn deadline(d: &Deployment) -> i64 {
    i64::from(d.spec.as_ref().and_then(|s| s.progress_deadline_seconds).unwrap_or(600))
}

fn nonzero(n: i32) -> Option<i32> {
    (n != 0).then_some(n)
}

/// Counts from the ReplicaSets, the conditions carried over, and `Available` (`calculateStatus`).
/// `all` includes the new ReplicaSet, if there is one.
pub fn calculate_status(
    all: &[&ReplicaSet],
    new: Option<&ReplicaSet>,
    d: &Deployment,
    now: jiff::Timestamp,
) -> DeploymentStatus {
    let old = d.status.clone().unwrap_or_default();
    let available = rollout::total_available(all.iter().copied());
    let unavailable = (rollout::total_replicas(all.iter().copied()) - available).max(0);
    let mut status = DeploymentStatus {
        observed_generation: d.metadata.generation.filter(|g| *g != 0),
        replicas: nonzero(rollout::total_actual(all.iter().copied())),
        updated_replicas: nonzero(rollout::total_actual(new)),
        ready_replicas: nonzero(rollout::total_ready(all.iter().copied())),
        available_replicas: nonzero(available),
        unavailable_replicas: nonzero(unavailable),
        collision_count: old.collision_count,
        conditions: old.conditions.clone(),
        terminating_replicas: old.terminating_replicas,
    };
    let c = if available >= replicas(d) - max_unavailable(d) {
        new_condition(AVAILABLE, "True", MINIMUM_REPLICAS_AVAILABLE, "Deployment has minimum availability.".into(), now)
    } else {
        new_condition(
            AVAILABLE,
            "False",
            MINIMUM_REPLICAS_UNAVAILABLE,
            "Deployment does not have minimum availability.".into(),
            now,
        )
    };
    set_condition(&mut status, c);
    status
}

fn n(v: Option<i32>) -> i32 {
    v.unwrap_or(0)
}

/// Every replica is updated and available, and the status is of the current generation
/// (`DeploymentComplete`).
pub fn deployment_complete(d: &Deployment, s: &DeploymentStatus) -> bool {
    let want = replicas(d);
    n(s.updated_replicas) == want
        && n(s.replicas) == want
        && n(s.available_replicas) == want
        && s.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
}

/// The new status shows progress over the stored one (`DeploymentProgressing`).
pub fn deployment_progressing(d: &Deployment, new: &DeploymentStatus) -> bool {
    let old = d.status.clone().unwrap_or_default();
    let old_old = n(old.replicas) - n(old.updated_replicas);
    let new_old = n(new.replicas) - n(new.updated_replicas);
    n(new.updated_replicas) > n(old.updated_replicas)
        || new_old < old_old
        || n(new.ready_replicas) > n(old.ready_replicas)
        || n(new.available_replicas) > n(old.available_replicas)
}

/// No progress was reported for `progressDeadlineSeconds` (`DeploymentTimedOut`).
pub fn deployment_timed_out(d: &Deployment, new: &DeploymentStatus, now: jiff::Timestamp) -> bool {
    if !has_progress_deadline(d) {
        return false;
    }
    let Some(c) = condition(new, PROGRESSING) else { return false };
    match c.reason.as_deref() {
        // A finished rollout is not timed out, even if the next one has not been noticed yet.
        Some(NEW_RS_AVAILABLE) => false,
        Some(TIMED_OUT) => true,
        _ => {
            c.last_update_time.as_ref().is_some_and(|from| from.0 + jiff::SignedDuration::from_secs(deadline(d)) < now)
        }
    }
}

fn rs_name(new: Option<&ReplicaSet>) -> Option<&str> {
    new.and_then(|rs| rs.metadata.name.as_deref())
}

/// The status after a rollout step (`syncRolloutStatus` without the write): counts, and
/// `Progressing` moved to complete, progressing or timed out; `ReplicaFailure` copied from the
/// new ReplicaSet (else from any).
pub fn rollout_status(
    all: &[&ReplicaSet],
    new: Option<&ReplicaSet>,
    d: &Deployment,
    now: jiff::Timestamp,
) -> DeploymentStatus {
    let mut status = calculate_status(all, new, d, now);
    let name = d.metadata.name.as_deref().unwrap_or("");
    if !has_progress_deadline(d) {
        remove_condition(&mut status, PROGRESSING);
    }
    let stored = d.status.clone().unwrap_or_default();
    let current = condition(&stored, PROGRESSING).cloned();
    let complete_before = n(status.replicas) == n(status.updated_replicas)
        && current.as_ref().is_some_and(|c| c.reason.as_deref() == Some(NEW_RS_AVAILABLE));
    if has_progress_deadline(d) && !complete_before {
        if deployment_complete(d, &status) {
            let msg = match rs_name(new) {
                Some(rs) => format!("ReplicaSet {rs:?} has successfully progressed."),
                None => format!("Deployment {name:?} has successfully progressed."),
            };
            set_condition(&mut status, new_condition(PROGRESSING, "True", NEW_RS_AVAILABLE, msg, now));
        } else if deployment_progressing(d, &status) {
            let msg = match rs_name(new) {
                Some(rs) => format!("ReplicaSet {rs:?} is progressing."),
                None => format!("Deployment {name:?} is progressing."),
            };
            let mut c = new_condition(PROGRESSING, "True", RS_UPDATED, msg, now);
            // Progress moves lastUpdateTime even when the reason stays the same.
            if let Some(current) = &current {
                if current.status == "True" {
                    c.last_transition_time = current.last_transition_time.clone();
                }
                remove_condition(&mut status, PROGRESSING);
            }
            set_condition(&mut status, c);
        } else if deployment_timed_out(d, &status, now) {
            let msg = match rs_name(new) {
                Some(rs) => format!("ReplicaSet {rs:?} has timed out progressing."),
                None => format!("Deployment {name:?} has timed out progressing."),
            };
            set_condition(&mut status, new_condition(PROGRESSING, "False", TIMED_OUT, msg, now));
        }
    }
    match replica_failure(all, new) {
        Some(c) => set_condition(&mut status, c),
        None => remove_condition(&mut status, REPLICA_FAILURE),
    }
    status
}

/// The new ReplicaSet's `ReplicaFailure`, else the first old one's (`getReplicaFailures`).
fn replica_failure(all: &[&ReplicaSet], new: Option<&ReplicaSet>) -> Option<DeploymentCondition> {
    let failure = |rs: &ReplicaSet| {
        rs.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == REPLICA_FAILURE).map(|c| {
            DeploymentCondition {
                type_: c.type_.clone(),
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
                last_transition_time: c.last_transition_time.clone(),
                last_update_time: c.last_transition_time.clone(),
            }
        })
    };
    new.and_then(failure).or_else(|| all.iter().find_map(|rs| failure(rs)))
}

/// When to look again for a rollout that may be stuck, so that its deadline is noticed
/// (`requeueStuckDeployment`): a second after `lastUpdateTime + progressDeadlineSeconds`.
pub fn recheck_progress_in(d: &Deployment, new: &DeploymentStatus, now: jiff::Timestamp) -> Option<Duration> {
    let stored = d.status.clone().unwrap_or_default();
    let current = condition(&stored, PROGRESSING)?;
    if !has_progress_deadline(d) || deployment_complete(d, new) || current.reason.as_deref() == Some(TIMED_OUT) {
        return None;
    }
    let from = current.last_update_time.as_ref()?.0;
    let after = (from + jiff::SignedDuration::from_secs(deadline(d))).duration_since(now);
    let after: Duration = after.try_into().unwrap_or(Duration::ZERO);
    Some(after + Duration::from_secs(1))
}

/// `Progressing` for a paused or resumed Deployment, if it changes (`checkPausedConditions`); a
/// reported timeout is kept.
pub fn paused_status(d: &Deployment, now: jiff::Timestamp) -> Option<DeploymentStatus> {
    if !has_progress_deadline(d) {
        return None;
    }
    let mut status = d.status.clone().unwrap_or_default();
    let reason = condition(&status, PROGRESSING).and_then(|c| c.reason.clone());
    if reason.as_deref() == Some(TIMED_OUT) {
        return None;
    }
    let paused_noted = reason.as_deref() == Some(PAUSED);
    let paused = d.spec.as_ref().and_then(|s| s.paused).unwrap_or(false);
    let c = if paused && !paused_noted {
        new_condition(PROGRESSING, "Unknown", PAUSED, "Deployment is paused".into(), now)
    } else if !paused && paused_noted {
        new_condition(PROGRESSING, "Unknown", RESUMED, "Deployment is resumed".into(), now)
    } else {
        return None;
    };
    set_condition(&mut status, c);
    Some(status)
}

#[cfg(test)]
mod tests {
    use super::super::rollout::testing::{deployment, rs};
    use super::*;
    use k8s_openapi::api::apps::v1::ReplicaSetCondition;

    fn at(secs: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn with_progressing(mut d: Deployment, status: &str, reason: &str, updated: i64) -> Deployment {
        let mut s = d.status.clone().unwrap_or_default();
        let mut c = new_condition(PROGRESSING, status, reason, "m".into(), at(updated));
        c.last_update_time = Some(api_time(at(updated)));
        set_condition(&mut s, c);
        d.status = Some(s);
        d
    }

    #[test]
    fn status_counts_come_from_the_replica_sets() {
        let mut d = deployment(4, "1", "1");
        d.metadata.generation = Some(3);
        let old = rs("old", 0, 3, 3, 3);
        let new = rs("new", 5, 2, 2, 1);
        let s = calculate_status(&[&old, &new], Some(&new), &d, at(0));
        assert_eq!(s.replicas, Some(5));
        assert_eq!(s.updated_replicas, Some(2));
        assert_eq!(s.ready_replicas, Some(4));
        assert_eq!(s.available_replicas, Some(4));
        assert_eq!(s.unavailable_replicas, Some(1));
        assert_eq!(s.observed_generation, Some(3));
        let c = condition(&s, AVAILABLE).unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_deref()), ("True", Some(MINIMUM_REPLICAS_AVAILABLE)));
        let few = rs("old", 0, 4, 4, 2);
        let s = calculate_status(&[&few], None, &d, at(0));
        assert_eq!(condition(&s, AVAILABLE).unwrap().reason.as_deref(), Some(MINIMUM_REPLICAS_UNAVAILABLE));
        assert_eq!(s.updated_replicas, None);
    }

    #[test]
    fn setting_the_same_condition_keeps_its_times_and_a_new_reason_keeps_the_transition() {
        let mut s = DeploymentStatus::default();
        set_condition(&mut s, new_condition(PROGRESSING, "True", NEW_RS_CREATED, "a".into(), at(0)));
        set_condition(&mut s, new_condition(PROGRESSING, "True", NEW_RS_CREATED, "b".into(), at(10)));
        let c = condition(&s, PROGRESSING).unwrap();
        assert_eq!((c.message.as_deref(), c.last_update_time.as_ref().unwrap().0), (Some("a"), at(0)));
        set_condition(&mut s, new_condition(PROGRESSING, "True", RS_UPDATED, "c".into(), at(20)));
        let c = condition(&s, PROGRESSING).unwrap();
        assert_eq!(c.last_transition_time.as_ref().unwrap().0, at(0));
        assert_eq!(c.last_update_time.as_ref().unwrap().0, at(20));
        set_condition(&mut s, new_condition(PROGRESSING, "False", TIMED_OUT, "d".into(), at(30)));
        assert_eq!(condition(&s, PROGRESSING).unwrap().last_transition_time.as_ref().unwrap().0, at(30));
        remove_condition(&mut s, PROGRESSING);
        assert_eq!(s.conditions, None);
    }

    #[test]
    fn a_complete_rollout_reports_the_new_replica_set_available() {
        let mut d = with_progressing(deployment(2, "1", "1"), "True", RS_UPDATED, 0);
        d.spec.as_mut().unwrap().progress_deadline_seconds = Some(600);
        let new = rs("web-abc", 5, 2, 2, 2);
        let s = rollout_status(&[&new], Some(&new), &d, at(30));
        let c = condition(&s, PROGRESSING).unwrap();
        assert_eq!(c.reason.as_deref(), Some(NEW_RS_AVAILABLE));
        assert_eq!(c.message.as_deref(), Some("ReplicaSet \"web-abc\" has successfully progressed."));
    }

    #[test]
    fn progress_moves_last_update_time_and_keeps_the_transition_time() {
        let mut d = with_progressing(deployment(3, "1", "1"), "True", NEW_RS_CREATED, 0);
        d.spec.as_mut().unwrap().progress_deadline_seconds = Some(600);
        let old = rs("old", 0, 3, 3, 3);
        let new = rs("web-abc", 5, 1, 1, 0);
        let s = rollout_status(&[&old, &new], Some(&new), &d, at(40));
        let c = condition(&s, PROGRESSING).unwrap();
        assert_eq!(c.reason.as_deref(), Some(RS_UPDATED));
        assert_eq!(c.message.as_deref(), Some("ReplicaSet \"web-abc\" is progressing."));
        assert_eq!(
            (c.last_transition_time.as_ref().unwrap().0, c.last_update_time.as_ref().unwrap().0),
            (at(0), at(40))
        );
    }

    #[test]
    fn no_progress_for_the_deadline_times_out() {
        let mut d = with_progressing(deployment(3, "1", "1"), "True", NEW_RS_CREATED, 0);
        d.spec.as_mut().unwrap().progress_deadline_seconds = Some(60);
        let new = rs("web-abc", 5, 3, 0, 0);
        let s = rollout_status(&[&new], Some(&new), &d, at(60));
        assert_eq!(
            condition(&s, PROGRESSING).unwrap().reason.as_deref(),
            Some(NEW_RS_CREATED),
            "not before the deadline"
        );
        assert_eq!(recheck_progress_in(&d, &s, at(30)), Some(Duration::from_secs(31)));
        let s = rollout_status(&[&new], Some(&new), &d, at(61));
        let c = condition(&s, PROGRESSING).unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_deref()), ("False", Some(TIMED_OUT)));
        assert_eq!(c.message.as_deref(), Some("ReplicaSet \"web-abc\" has timed out progressing."));
        let timed_out = with_progressing(d.clone(), "False", TIMED_OUT, 61);
        assert_eq!(recheck_progress_in(&timed_out, &s, at(62)), None);
    }

    #[test]
    fn without_a_deadline_there_is_no_progressing_condition() {
        let mut d = with_progressing(deployment(1, "1", "1"), "True", NEW_RS_CREATED, 0);
        d.spec.as_mut().unwrap().progress_deadline_seconds = Some(i32::MAX);
        let new = rs("n", 0, 1, 1, 1);
        let s = rollout_status(&[&new], Some(&new), &d, at(5));
        assert!(condition(&s, PROGRESSING).is_none());
        assert_eq!(recheck_progress_in(&d, &s, at(5)), None);
    }

    #[test]
    fn replica_failure_of_the_new_replica_set_is_copied() {
        let d = deployment(1, "1", "1");
        let mut new = rs("n", 0, 1, 0, 0);
        new.status.as_mut().unwrap().conditions = Some(vec![ReplicaSetCondition {
            type_: REPLICA_FAILURE.into(),
            status: "True".into(),
            reason: Some("FailedCreate".into()),
            message: Some("forbidden".into()),
            last_transition_time: Some(api_time(at(1))),
        }]);
        let s = rollout_status(&[&new], Some(&new), &d, at(5));
        let c = condition(&s, REPLICA_FAILURE).unwrap();
        assert_eq!((c.reason.as_deref(), c.message.as_deref()), (Some("FailedCreate"), Some("forbidden")));
        new.status.as_mut().unwrap().conditions = None;
        let mut d2 = d.clone();
        d2.status = Some(s);
        assert!(condition(&rollout_status(&[&new], Some(&new), &d2, at(6)), REPLICA_FAILURE).is_none());
    }

    #[test]
    fn pausing_and_resuming_are_noted_in_progressing_unless_timed_out() {
        let mut d = deployment(1, "1", "1");
        d.spec.as_mut().unwrap().progress_deadline_seconds = Some(600);
        d.spec.as_mut().unwrap().paused = Some(true);
        let s = paused_status(&d, at(0)).unwrap();
        let c = condition(&s, PROGRESSING).unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_deref()), ("Unknown", Some(PAUSED)));
        d.status = Some(s);
        assert_eq!(paused_status(&d, at(1)), None, "already noted");
        d.spec.as_mut().unwrap().paused = Some(false);
        let s = paused_status(&d, at(2)).unwrap();
        assert_eq!(condition(&s, PROGRESSING).unwrap().reason.as_deref(), Some(RESUMED));
        let timed_out = with_progressing(d, "False", TIMED_OUT, 0);
        let mut paused = timed_out.clone();
        paused.spec.as_mut().unwrap().paused = Some(true);
        assert_eq!(paused_status(&paused, at(3)), None);
    }
}
