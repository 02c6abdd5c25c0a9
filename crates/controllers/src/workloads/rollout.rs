//! The arithmetic of a Deployment's rollout: fenceposts (`maxSurge`, `maxUnavailable`), which
//! ReplicaSet is new, how far to scale the new one up and the old ones down, proportional
//! scaling when the Deployment is resized mid-rollout, and which old ReplicaSets to clean up.
//!
//! As `pkg/controller/deployment` (`rolling.go`, `recreate.go`, `sync.go`, `util/`), with two
//! deliberate tightenings so that the bounds hold for the pods that actually exist and not just
//! for the ReplicaSets' specs while their controllers catch up: the pods a ReplicaSet may have are
//! counted as the larger of its `spec.replicas` and `status.replicas` (a ReplicaSet scaled down
//! still has its pods until its controller has deleted them), and the available pods it will
//! keep as the smaller of `status.availableReplicas` and `spec.replicas` (scaling down removes the
//! least valuable pods first, so at most that many available ones survive).

use std::cmp::Ordering;
use std::collections::HashMap;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::revision::{self, desired_replicas_annotation, max_replicas_annotation};

pub const ROLLING_UPDATE: &str = "RollingUpdate";
pub const RECREATE: &str = "Recreate";

/// `spec.replicas` of a Deployment (the server defaults it to 1).
pub fn replicas(d: &Deployment) -> i32 {
    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

/// `spec.strategy.type`, `RollingUpdate` unless it says `Recreate`.
pub fn strategy(d: &Deployment) -> &str {
    match d.spec.as_ref().and_then(|s| s.strategy.as_ref()).and_then(|s| s.type_.as_deref()) {
        Some(RECREATE) => RECREATE,
        _ => ROLLING_UPDATE,
    }
}

pub fn is_rolling_update(d: &Deployment) -> bool {
    strategy(d) == ROLLING_UPDATE
}

/// An int, or a percentage of `total` rounded up or down (`GetScaledValueFromIntOrPercent`).
pub fn scaled_value(v: &IntOrString, total: i32, round_up: bool) -> Result<i32, String> {
    match v {
        IntOrString::Int(i) => Ok(*i),
        IntOrString::String(s) => {
            let pct: i64 = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| format!("invalid value for IntOrString: invalid value {s:?}"))?;
            let scaled = pct as f64 * f64::from(total) / 100.0;
            Ok((if round_up { scaled.ceil() } else { scaled.floor() }) as i32)
        }
    }
}

/// `maxSurge` rounded up and `maxUnavailable` rounded down against `desired`; when both come to
/// zero, one pod may be unavailable (`ResolveFenceposts`: surge might not work due to quota).
pub fn resolve_fenceposts(
    max_surge: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    desired: i32,
) -> Result<(i32, i32), String> {
    let zero = IntOrString::Int(0);
    let surge = scaled_value(max_surge.unwrap_or(&zero), desired, true)?;
    let mut unavailable = scaled_value(max_unavailable.unwrap_or(&zero), desired, false)?;
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    Ok((surge, unavailable))
}

fn fenceposts(d: &Deployment) -> (i32, i32) {
    let ru = d.spec.as_ref().and_then(|s| s.strategy.as_ref()).and_then(|s| s.rolling_update.as_ref());
    // The server validates both values; an invalid one counts as zero.
    resolve_fenceposts(ru.and_then(|r| r.max_surge.as_ref()), ru.and_then(|r| r.max_unavailable.as_ref()), replicas(d))
        .unwrap_or((0, 1))
}

/// Pods the Deployment may have above `spec.replicas` (`MaxSurge`; 0 for Recreate).
pub fn max_surge(d: &Deployment) -> i32 {
    if !is_rolling_update(d) {
        return 0;
    }
    fenceposts(d).0
}

/// Pods that may be unavailable (`MaxUnavailable`; 0 for Recreate or no replicas, never more
/// than `spec.replicas`).
pub fn max_unavailable(d: &Deployment) -> i32 {
    if !is_rolling_update(d) || replicas(d) == 0 {
        return 0;
    }
    fenceposts(d).1.min(replicas(d))
}

/// `spec.replicas` of a ReplicaSet.
pub fn rs_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
}

pub fn rs_actual(rs: &ReplicaSet) -> i32 {
    rs.status.as_ref().map_or(0, |s| s.replicas)
}

pub fn rs_available(rs: &ReplicaSet) -> i32 {
    rs.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0)
}

pub fn rs_ready(rs: &ReplicaSet) -> i32 {
    rs.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0)
}

/// Sum of `spec.replicas` (`GetReplicaCountForReplicaSets`).
pub fn total_replicas<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> i32 {
    rss.into_iter().map(rs_replicas).sum()
}

/// Sum of `status.replicas` (`GetActualReplicaCountForReplicaSets`).
pub fn total_actual<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> i32 {
    rss.into_iter().map(rs_actual).sum()
}

/// Sum of `status.availableReplicas`.
pub fn total_available<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> i32 {
    rss.into_iter().map(rs_available).sum()
}

/// Sum of `status.readyReplicas`.
pub fn total_ready<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> i32 {
    rss.into_iter().map(rs_ready).sum()
}

/// The most pods the ReplicaSets may have right now: `spec.replicas`, or more while a scale-down
/// is still being carried out.
pub fn pods_upper_bound<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> i32 {
    rss.into_iter().map(|rs| rs_replicas(rs).max(rs_actual(rs))).sum()
}

/// Oldest first, by creation time then name (`ReplicaSetsByCreationTimestamp`).
pub fn by_creation(a: &ReplicaSet, b: &ReplicaSet) -> Ordering {
    let t = |rs: &ReplicaSet| rs.metadata.creation_timestamp.as_ref().map(|t| t.0);
    t(a).cmp(&t(b)).then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// The ReplicaSet whose template equals the Deployment's, ignoring the hash label; the oldest
/// if several do (`FindNewReplicaSet`).
pub fn find_new_replica_set<'a>(d: &Deployment, rss: &'a [ReplicaSet]) -> Option<&'a ReplicaSet> {
    let template = &d.spec.as_ref()?.template;
    let mut sorted: Vec<&ReplicaSet> = rss.iter().collect();
    sorted.sort_by(|a, b| by_creation(a, b));
    sorted.into_iter().find(|rs| {
        rs.spec.as_ref().and_then(|s| s.template.as_ref()).is_some_and(|t| revision::equal_ignore_hash(t, template))
    })
}

/// Every ReplicaSet but the new one (`FindOldReplicaSets`' all-old list).
pub fn old_replica_sets<'a>(rss: &'a [ReplicaSet], new: Option<&ReplicaSet>) -> Vec<&'a ReplicaSet> {
    let new_uid = new.and_then(|n| n.metadata.uid.as_deref());
    rss.iter().filter(|rs| new_uid.is_none() || rs.metadata.uid.as_deref() != new_uid).collect()
}

/// ReplicaSets with pods wanted (`FilterActiveReplicaSets`).
pub fn active<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> Vec<&'a ReplicaSet> {
    rss.into_iter().filter(|rs| rs_replicas(rs) > 0).collect()
}

/// The size of the new ReplicaSet for the next step of the rollout (`NewRSNewReplicas`):
/// Recreate goes straight to `spec.replicas`; RollingUpdate adds what the surge allows, never
/// above `spec.replicas`. `all` includes `new`.
pub fn new_rs_new_replicas(d: &Deployment, all: &[&ReplicaSet], new: &ReplicaSet) -> i32 {
    let want = replicas(d);
    if !is_rolling_update(d) {
        return want;
    }
    let current = pods_upper_bound(all.iter().copied());
    let max_total = want + max_surge(d);
    if current >= max_total {
        return rs_replicas(new);
    }
    let up = (max_total - current).min(want - rs_replicas(new));
    rs_replicas(new) + up
}

/// The new ReplicaSet's next size, if it changes (`reconcileNewReplicaSet`).
pub fn reconcile_new_replica_set(d: &Deployment, all: &[&ReplicaSet], new: &ReplicaSet) -> Option<i32> {
    let (want, have) = (replicas(d), rs_replicas(new));
    let next = match have.cmp(&want) {
        Ordering::Equal => return None,
        Ordering::Greater => want,
        Ordering::Less => new_rs_new_replicas(d, all, new),
    };
    (next != have).then_some(next)
}

/// A ReplicaSet scaled to a new size, in the order the writes are made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub name: String,
    pub replicas: i32,
}

fn step(rs: &ReplicaSet, replicas: i32) -> Step {
    Step { name: rs.metadata.name.clone().unwrap_or_default(), replicas }
}

/// The scale-downs of old ReplicaSets in a rolling update (`reconcileOldReplicaSets`): first
/// their unhealthy replicas (`cleanupUnhealthyReplicas`), then as many as keeps
/// `spec.replicas - maxUnavailable` available (`scaleDownOldReplicaSetsForRollingUpdate`),
/// oldest ReplicaSets first. `old` are the active old ReplicaSets.
pub fn old_scale_downs(d: &Deployment, old: &[&ReplicaSet], new: &ReplicaSet) -> Vec<Step> {
    let old_pods = total_replicas(old.iter().copied());
    if old_pods == 0 {
        return Vec::new();
    }
    let all_pods = old_pods + rs_replicas(new);
    let min_available = replicas(d) - max_unavailable(d);
    let new_unavailable = rs_replicas(new) - rs_available(new).min(rs_replicas(new));
    let max_scaled_down = all_pods - min_available - new_unavailable;
    if max_scaled_down <= 0 {
        return Vec::new();
    }
    let mut sorted: Vec<&ReplicaSet> = old.to_vec();
    sorted.sort_by(|a, b| by_creation(a, b));
    // Sizes as the steps change them.
    let mut sizes: Vec<i32> = sorted.iter().map(|rs| rs_replicas(rs)).collect();
    let mut steps = Vec::new();

    let mut cleaned = 0;
    for (i, rs) in sorted.iter().enumerate() {
        if cleaned >= max_scaled_down {
            break;
        }
        let available = rs_available(rs).min(sizes[i]);
        if sizes[i] == 0 || sizes[i] == available {
            continue;
        }
        let down = (max_scaled_down - cleaned).min(sizes[i] - available);
        sizes[i] -= down;
        cleaned += down;
        steps.push(step(rs, sizes[i]));
    }

    let available: i32 = sorted.iter().zip(&sizes).map(|(rs, size)| rs_available(rs).min(*size)).sum::<i32>()
        + rs_available(new).min(rs_replicas(new));
    if available <= min_available {
        return steps;
    }
    let to_scale_down = available - min_available;
    let mut scaled = 0;
    for (i, rs) in sorted.iter().enumerate() {
        if scaled >= to_scale_down {
            break;
        }
        if sizes[i] == 0 {
            continue;
        }
        let down = sizes[i].min(to_scale_down - scaled);
        sizes[i] -= down;
        scaled += down;
        steps.push(step(rs, sizes[i]));
    }
    steps
}

/// The only active ReplicaSet, or the newest when none is active; none when several are
/// (`FindActiveOrLatest`).
pub fn find_active_or_latest<'a>(new: Option<&'a ReplicaSet>, old: &[&'a ReplicaSet]) -> Option<&'a ReplicaSet> {
    if new.is_none() && old.is_empty() {
        return None;
    }
    let mut newest_first: Vec<&ReplicaSet> = old.to_vec();
    newest_first.sort_by(|a, b| by_creation(b, a));
    let all_active: Vec<&ReplicaSet> = active(newest_first.iter().copied().chain(new));
    match all_active.len() {
        0 => new.or(newest_first.first().copied()),
        1 => Some(all_active[0]),
        _ => None,
    }
}

/// The new ReplicaSet has all the Deployment's replicas, available (`IsSaturated`).
pub fn is_saturated(d: &Deployment, rs: Option<&ReplicaSet>) -> bool {
    let Some(rs) = rs else { return false };
    let want = replicas(d);
    desired_replicas_annotation(rs) == Some(want) && rs_replicas(rs) == want && rs_available(rs) == want
}

/// Some active ReplicaSet was last scaled for another `spec.replicas` (`isScalingEvent`).
pub fn is_scaling_event<'a>(d: &Deployment, rss: impl IntoIterator<Item = &'a ReplicaSet>) -> bool {
    let want = replicas(d);
    active(rss).into_iter().any(|rs| desired_replicas_annotation(rs).is_some_and(|desired| desired != want))
}

/// What scaling the Deployment does (`scale`): the single active (or newest) ReplicaSet takes
/// every replica; a saturated new one leaves the old ones at zero; otherwise, in a rolling
/// update, the difference to `replicas + maxSurge` is spread over the active ReplicaSets in
/// proportion to their size, leftovers to the largest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scaling {
    /// Scale each to its size, skipping those already there (`scaleReplicaSetAndRecordEvent`).
    To(Vec<Step>),
    /// Write every one, sizes and replica annotations, reporting this direction
    /// (`scaleReplicaSet` with the operation "up", "down" or "").
    Proportional(Vec<Step>, &'static str),
}

pub fn scale(d: &Deployment, new: Option<&ReplicaSet>, old: &[&ReplicaSet]) -> Scaling {
    let want = replicas(d);
    if let Some(rs) = find_active_or_latest(new, old) {
        return Scaling::To(if rs_replicas(rs) == want { Vec::new() } else { vec![step(rs, want)] });
    }
    if is_saturated(d, new) {
        return Scaling::To(active(old.iter().copied()).into_iter().map(|rs| step(rs, 0)).collect());
    }
    if !is_rolling_update(d) {
        return Scaling::To(Vec::new());
    }
    let mut all = active(old.iter().copied().chain(new));
    let allowed = if want > 0 { want + max_surge(d) } else { 0 };
    let to_add = allowed - total_replicas(all.iter().copied());
    let size_desc = |a: &&ReplicaSet, b: &&ReplicaSet| rs_replicas(b).cmp(&rs_replicas(a));
    let operation = match to_add.cmp(&0) {
        Ordering::Greater => {
            // Larger first; among equals, newer first.
            all.sort_by(|a, b| size_desc(a, b).then_with(|| by_creation(b, a)));
            "up"
        }
        Ordering::Less => {
            // Larger first; among equals, older first.
            all.sort_by(|a, b| size_desc(a, b).then_with(|| by_creation(a, b)));
            "down"
        }
        Ordering::Equal => "",
    };
    let mut added = 0;
    let mut sizes: Vec<i32> = Vec::with_capacity(all.len());
    for rs in &all {
        if to_add != 0 {
            let p = proportion(rs, d, to_add, added);
            sizes.push(rs_replicas(rs) + p);
            added += p;
        } else {
            sizes.push(rs_replicas(rs));
        }
    }
    if to_add != 0 && !sizes.is_empty() {
        sizes[0] = (sizes[0] + to_add - added).max(0);
    }
    Scaling::Proportional(all.iter().zip(sizes).map(|(rs, n)| step(rs, n)).collect(), operation)
}

/// What one ReplicaSet gets of `to_add` (`GetProportion`): its share of the new
/// `replicas + maxSurge`, no more than what is left to add (or remove).
pub fn proportion(rs: &ReplicaSet, d: &Deployment, to_add: i32, added: i32) -> i32 {
    if rs_replicas(rs) == 0 || to_add == 0 || to_add == added {
        return 0;
    }
    let fraction = fraction(rs, d);
    let allowed = to_add - added;
    if to_add > 0 { fraction.min(allowed) } else { fraction.max(allowed) }
}

/// `getReplicaSetFraction`: the ReplicaSet resized by the ratio of the Deployment's new
/// `replicas + maxSurge` to the one it was last scaled for, minus its size.
fn fraction(rs: &ReplicaSet, d: &Deployment) -> i32 {
    let size = rs_replicas(rs);
    if replicas(d) == 0 {
        return -size;
    }
    let max_now = replicas(d) + max_surge(d);
    let before = match max_replicas_annotation(rs) {
        Some(n) if n != 0 => n,
        // Edited by hand, or scaled to zero and back: fall back to the Deployment's size.
        _ => d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0),
    };
    if before == 0 {
        return 0;
    }
    let new_size = f64::from(size) * f64::from(max_now) / f64::from(before);
    new_size.round() as i32 - size
}

/// The scale-downs of a Recreate rollout: every active old ReplicaSet to zero.
pub fn recreate_scale_downs(old: &[&ReplicaSet]) -> Vec<Step> {
    active(old.iter().copied()).into_iter().map(|rs| step(rs, 0)).collect()
}

/// Whether pods of old ReplicaSets still run, so a Recreate must wait (`oldPodsRunning`):
/// `pods_by_rs` maps ReplicaSet UIDs to the pods they control.
pub fn old_pods_running(
    new: Option<&ReplicaSet>,
    old: &[&ReplicaSet],
    pods_by_rs: &HashMap<String, Vec<&Pod>>,
) -> bool {
    if total_actual(old.iter().copied()) > 0 {
        return true;
    }
    let new_uid = new.and_then(|n| n.metadata.uid.as_deref());
    pods_by_rs
        .iter()
        .filter(|(uid, _)| Some(uid.as_str()) != new_uid)
        .flat_map(|(_, pods)| pods.iter())
        .any(|p| !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Failed" | "Succeeded")))
}

/// Old ReplicaSets beyond `revisionHistoryLimit` that may be deleted, lowest revision first
/// (`cleanupDeployment`): only those with no pods wanted or left and a status that has caught
/// up with their spec.
pub fn history_to_clean_up<'a>(d: &Deployment, old: &[&'a ReplicaSet]) -> Vec<&'a ReplicaSet> {
    let Some(limit) = d.spec.as_ref().and_then(|s| s.revision_history_limit) else { return Vec::new() };
    let mut alive: Vec<&ReplicaSet> =
        old.iter().copied().filter(|rs| rs.metadata.deletion_timestamp.is_none()).collect();
    let excess = alive.len() as i64 - i64::from(limit);
    if excess <= 0 {
        return Vec::new();
    }
    alive.sort_by(|a, b| {
        let r = |rs: &ReplicaSet| revision::revision_of(rs.metadata.annotations.as_ref());
        r(a).cmp(&r(b)).then_with(|| by_creation(a, b))
    });
    alive
        .into_iter()
        .take(excess as usize)
        .filter(|rs| {
            let observed = rs.status.as_ref().and_then(|s| s.observed_generation).unwrap_or(0);
            rs_actual(rs) == 0 && rs_replicas(rs) == 0 && rs.metadata.generation.unwrap_or(0) <= observed
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod testing {
    use k8s_openapi::api::apps::v1::{
        Deployment, DeploymentSpec, DeploymentStrategy, ReplicaSet, ReplicaSetSpec, ReplicaSetStatus,
        RollingUpdateDeployment,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    pub fn ios(s: &str) -> IntOrString {
        match s.parse::<i32>() {
            Ok(i) => IntOrString::Int(i),
            Err(_) => IntOrString::String(s.into()),
        }
    }

    pub fn deployment(replicas: i32, surge: &str, unavailable: &str) -> Deployment {
        Deployment {
            metadata: ObjectMeta { name: Some("web".into()), namespace: Some("ns".into()), ..Default::default() },
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                strategy: Some(DeploymentStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateDeployment {
                        max_surge: Some(ios(surge)),
                        max_unavailable: Some(ios(unavailable)),
                    }),
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    /// A ReplicaSet created at second `created` with `spec` replicas, `actual` pods and
    /// `available` of them available.
    pub fn rs(name: &str, created: i64, spec: i32, actual: i32, available: i32) -> ReplicaSet {
        ReplicaSet {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                creation_timestamp: Some(Time(jiff::Timestamp::from_second(1_700_000_000 + created).unwrap())),
                generation: Some(1),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec { replicas: Some(spec), ..Default::default() }),
            status: Some(ReplicaSetStatus {
                replicas: actual,
                available_replicas: Some(available),
                ready_replicas: Some(available),
                observed_generation: Some(1),
                ..Default::default()
            }),
        }
    }

    pub fn annotated(mut rs: ReplicaSet, pairs: &[(&str, &str)]) -> ReplicaSet {
        let a = rs.metadata.annotations.get_or_insert_with(Default::default);
        for (k, v) in pairs {
            a.insert(k.to_string(), v.to_string());
        }
        rs
    }
}

#[cfg(test)]
mod tests {
    use super::super::revision::{DESIRED_REPLICAS, MAX_REPLICAS, REVISION};
    use super::testing::*;
    use super::*;

    fn steps(v: &[(&str, i32)]) -> Vec<Step> {
        v.iter().map(|(n, r)| Step { name: n.to_string(), replicas: *r }).collect()
    }

    #[test]
    fn percentages_round_surge_up_and_unavailable_down() {
        assert_eq!(scaled_value(&ios("25%"), 10, true), Ok(3));
        assert_eq!(scaled_value(&ios("25%"), 10, false), Ok(2));
        assert_eq!(scaled_value(&ios("3"), 10, false), Ok(3));
        assert_eq!(scaled_value(&ios("0%"), 10, true), Ok(0));
        assert!(scaled_value(&IntOrString::String("abc".into()), 10, true).is_err());
        assert_eq!(resolve_fenceposts(Some(&ios("25%")), Some(&ios("25%")), 4), Ok((1, 1)));
        assert_eq!(resolve_fenceposts(Some(&ios("25%")), Some(&ios("25%")), 1), Ok((1, 0)));
        assert_eq!(resolve_fenceposts(Some(&ios("10%")), Some(&ios("10%")), 5), Ok((1, 0)));
    }

    #[test]
    fn both_fenceposts_at_zero_allow_one_unavailable() {
        assert_eq!(resolve_fenceposts(Some(&ios("0")), Some(&ios("0")), 3), Ok((0, 1)));
        assert_eq!(resolve_fenceposts(Some(&ios("0%")), Some(&ios("20%")), 3), Ok((0, 1)), "20% of 3 rounds down to 0");
        let d = deployment(3, "0", "0");
        assert_eq!((max_surge(&d), max_unavailable(&d)), (0, 1));
    }

    #[test]
    fn max_unavailable_is_capped_by_replicas_and_zero_for_recreate() {
        assert_eq!(max_unavailable(&deployment(2, "1", "5")), 2);
        assert_eq!(max_unavailable(&deployment(0, "1", "1")), 0);
        let mut d = deployment(3, "1", "1");
        d.spec.as_mut().unwrap().strategy.as_mut().unwrap().type_ = Some("Recreate".into());
        assert_eq!((max_surge(&d), max_unavailable(&d)), (0, 0));
    }

    #[test]
    fn the_new_replica_set_grows_by_the_surge_and_never_past_replicas() {
        let d = deployment(4, "1", "1");
        let old = rs("old", 0, 4, 4, 4);
        let new = rs("new", 10, 0, 0, 0);
        assert_eq!(reconcile_new_replica_set(&d, &[&old, &new], &new), Some(1));
        let old = rs("old", 0, 3, 3, 3);
        let new = rs("new", 10, 1, 1, 1);
        assert_eq!(reconcile_new_replica_set(&d, &[&old, &new], &new), Some(2));
        let d = deployment(4, "10", "1");
        let old = rs("old", 0, 1, 1, 1);
        assert_eq!(reconcile_new_replica_set(&d, &[&old, &new], &new), Some(4), "never more than replicas");
        let big = rs("new", 10, 6, 6, 6);
        assert_eq!(reconcile_new_replica_set(&d, &[&big], &big), Some(4), "too large: straight down");
        let done = rs("new", 10, 4, 4, 4);
        assert_eq!(reconcile_new_replica_set(&d, &[&done], &done), None);
    }

    #[test]
    fn pods_an_old_replica_set_still_has_count_against_the_surge() {
        let d = deployment(4, "1", "1");
        // The old ReplicaSet was scaled to 3 but still has 4 pods: no room to surge yet.
        let old = rs("old", 0, 3, 4, 4);
        let new = rs("new", 10, 1, 1, 0);
        assert_eq!(reconcile_new_replica_set(&d, &[&old, &new], &new), None);
        let old = rs("old", 0, 3, 3, 3);
        assert_eq!(reconcile_new_replica_set(&d, &[&old, &new], &new), Some(2));
    }

    #[test]
    fn old_replica_sets_scale_down_only_as_far_as_availability_allows() {
        let d = deployment(4, "1", "1");
        // 4 old available + 1 new not yet available: may lose one.
        let old = rs("old", 0, 4, 4, 4);
        let new = rs("new", 10, 1, 1, 0);
        assert_eq!(old_scale_downs(&d, &[&old], &new), steps(&[("old", 3)]));
        // Once the new pod is available, two may go.
        let new = rs("new", 10, 1, 1, 1);
        assert_eq!(old_scale_downs(&d, &[&old], &new), steps(&[("old", 2)]));
        // Nothing goes while that would leave fewer than 3 available.
        let old = rs("old", 0, 3, 3, 3);
        let new = rs("new", 10, 2, 2, 0);
        assert_eq!(old_scale_downs(&d, &[&old], &new), steps(&[]));
    }

    #[test]
    fn unhealthy_old_replicas_are_cleaned_up_first() {
        let d = deployment(4, "1", "1");
        let a = rs("a", 0, 2, 2, 1);
        let b = rs("b", 5, 2, 2, 2);
        let new = rs("new", 10, 1, 1, 0);
        // maxScaledDown = 5 - 3 - 1 = 1: the unhealthy replica of `a` goes, nothing more (3 available).
        assert_eq!(old_scale_downs(&d, &[&b, &a], &new), steps(&[("a", 1)]));
    }

    #[test]
    fn availability_still_being_lost_by_a_scale_down_is_not_counted() {
        let d = deployment(4, "1", "1");
        // The old ReplicaSet was scaled to 3; its status still shows 4 available. With the new
        // one's single available pod, 4 will be available: one more may go, not two.
        let old = rs("old", 0, 3, 4, 4);
        let new = rs("new", 10, 2, 2, 1);
        assert_eq!(old_scale_downs(&d, &[&old], &new), steps(&[("old", 2)]));
    }

    #[test]
    fn proportional_scaling_spreads_the_difference_by_size_with_leftovers_to_the_largest() {
        // 10 replicas, surge 3 (ceil 25%), scaled to 15 → surge 4: allowed 19, had 13.
        let mut d = deployment(15, "25%", "25%");
        let old = annotated(rs("old", 0, 8, 8, 8), &[(DESIRED_REPLICAS, "10"), (MAX_REPLICAS, "13")]);
        let new = annotated(rs("new", 10, 5, 5, 0), &[(DESIRED_REPLICAS, "10"), (MAX_REPLICAS, "13")]);
        d.status = Some(Default::default());
        assert!(is_scaling_event(&d, [&old, &new]));
        // old: 8*19/13 = 11.69 → 12 (+4); new: 5*19/13 = 7.3 → 7 (+2): 6 added of 6.
        assert_eq!(scale(&d, Some(&new), &[&old]), Scaling::Proportional(steps(&[("old", 12), ("new", 7)]), "up"));

        // Scaling down 10 → 5 (surge 2: allowed 7 of 13).
        let d = deployment(5, "25%", "25%");
        // old: 8*7/13 = 4.3 → 4 (-4); new: 5*7/13 = 2.69 → 3 (-2): 6 removed of 6.
        assert_eq!(scale(&d, Some(&new), &[&old]), Scaling::Proportional(steps(&[("old", 4), ("new", 3)]), "down"));
    }

    #[test]
    fn proportional_leftovers_go_to_the_largest_replica_set() {
        let d = deployment(4, "1", "0");
        // Last scaled for 3 (+1): three of size 1; now 4 + 1 = 5 allowed, 3 there: 2 to add.
        let ann = [(DESIRED_REPLICAS, "3"), (MAX_REPLICAS, "4")];
        let a = annotated(rs("a", 0, 1, 1, 1), &ann);
        let b = annotated(rs("b", 5, 1, 1, 1), &ann);
        let c = annotated(rs("c", 10, 1, 1, 0), &ann);
        // Each: 1*5/4 = 1.25 → 1 (+0); the 2 left go to the first (largest; among equals the newest).
        assert_eq!(scale(&d, Some(&c), &[&a, &b]), Scaling::Proportional(steps(&[("c", 3), ("b", 1), ("a", 1)]), "up"));
    }

    #[test]
    fn proportion_never_exceeds_what_is_left() {
        let d = deployment(20, "0", "1");
        let big = annotated(rs("big", 0, 10, 10, 10), &[(MAX_REPLICAS, "10")]);
        assert_eq!(proportion(&big, &d, 3, 0), 3, "10*20/10 - 10 = 10, capped at 3");
        assert_eq!(proportion(&big, &d, 3, 3), 0);
        let d0 = deployment(0, "0", "1");
        assert_eq!(proportion(&big, &d0, -10, 0), -10, "scaling to zero removes everything");
        // Without the annotation and without a status, there is no base to scale from.
        let bare = rs("bare", 0, 4, 4, 4);
        assert_eq!(proportion(&bare, &d, 5, 0), 0);
    }

    #[test]
    fn a_single_active_replica_set_takes_all_replicas() {
        let d = deployment(5, "1", "1");
        let old = rs("old", 0, 0, 0, 0);
        let new = rs("new", 10, 3, 3, 3);
        assert_eq!(scale(&d, Some(&new), &[&old]), Scaling::To(steps(&[("new", 5)])));
        // No active one: the newest old one when there is no new one.
        let older = rs("older", 0, 0, 0, 0);
        let newer = rs("newer", 5, 0, 0, 0);
        assert_eq!(scale(&d, None, &[&older, &newer]), Scaling::To(steps(&[("newer", 5)])));
    }

    #[test]
    fn a_saturated_new_replica_set_scales_the_old_ones_to_zero() {
        let d = deployment(3, "1", "1");
        let new = annotated(rs("new", 10, 3, 3, 3), &[(DESIRED_REPLICAS, "3")]);
        let old = rs("old", 0, 1, 1, 1);
        assert!(is_saturated(&d, Some(&new)));
        assert_eq!(scale(&d, Some(&new), &[&old]), Scaling::To(steps(&[("old", 0)])));
    }

    #[test]
    fn finding_the_new_replica_set_ignores_the_hash_and_prefers_the_oldest() {
        let mut d = deployment(1, "1", "1");
        let template = |image: &str, hash: &str| k8s_openapi::api::core::v1::PodTemplateSpec {
            metadata: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                labels: Some(
                    [("app".to_string(), "web".to_string()), ("pod-template-hash".to_string(), hash.to_string())]
                        .into_iter()
                        .filter(|(_, v)| !v.is_empty())
                        .collect(),
                ),
                ..Default::default()
            }),
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                containers: vec![k8s_openapi::api::core::v1::Container {
                    name: "c".into(),
                    image: Some(image.into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        };
        d.spec.as_mut().unwrap().template = template("v1", "");
        let mut a = rs("a", 5, 1, 1, 1);
        a.spec.as_mut().unwrap().template = Some(template("v1", "h1"));
        let mut b = rs("b", 0, 1, 1, 1);
        b.spec.as_mut().unwrap().template = Some(template("v1", "h2"));
        let mut c = rs("c", 0, 1, 1, 1);
        c.spec.as_mut().unwrap().template = Some(template("v2", "h3"));
        let all = [a, b, c];
        assert_eq!(find_new_replica_set(&d, &all).unwrap().metadata.name.as_deref(), Some("b"));
        let new = find_new_replica_set(&d, &all);
        let old: Vec<_> = old_replica_sets(&all, new).iter().map(|rs| rs.metadata.name.clone().unwrap()).collect();
        assert_eq!(old, vec!["a", "c"]);
    }

    #[test]
    fn history_beyond_the_limit_is_cleaned_lowest_revision_first() {
        let mut d = deployment(1, "1", "1");
        d.spec.as_mut().unwrap().revision_history_limit = Some(1);
        let r1 = annotated(rs("r1", 0, 0, 0, 0), &[(REVISION, "1")]);
        let r2 = annotated(rs("r2", 5, 0, 0, 0), &[(REVISION, "2")]);
        let r3 = annotated(rs("r3", 9, 0, 0, 0), &[(REVISION, "3")]);
        let names = |v: Vec<&ReplicaSet>| v.iter().map(|r| r.metadata.name.clone().unwrap()).collect::<Vec<_>>();
        assert_eq!(names(history_to_clean_up(&d, &[&r3, &r1, &r2])), vec!["r1", "r2"]);
        // One still with pods, or with a status behind its spec, is kept.
        let busy = annotated(rs("r1", 0, 0, 1, 0), &[(REVISION, "1")]);
        let mut behind = annotated(rs("r2", 5, 0, 0, 0), &[(REVISION, "2")]);
        behind.metadata.generation = Some(2);
        assert!(history_to_clean_up(&d, &[&r3, &busy, &behind]).is_empty());
        d.spec.as_mut().unwrap().revision_history_limit = None;
        assert!(history_to_clean_up(&d, &[&r3, &r1, &r2]).is_empty());
    }

    #[test]
    fn recreate_waits_while_old_pods_run() {
        let new = rs("new", 10, 0, 0, 0);
        let old = rs("old", 0, 0, 1, 0);
        assert!(old_pods_running(Some(&new), &[&old], &HashMap::new()));
        let old = rs("old", 0, 0, 0, 0);
        let mut finished = super::super::pods::testing::pod("done", 0);
        finished.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let pending = super::super::pods::testing::pod("p", 0);
        let mine = super::super::pods::testing::pod("mine", 0);
        let mut map: HashMap<String, Vec<&Pod>> = HashMap::new();
        map.insert("uid-old".into(), vec![&finished]);
        map.insert("uid-new".into(), vec![&mine]);
        assert!(!old_pods_running(Some(&new), &[&old], &map));
        map.get_mut("uid-old").unwrap().push(&pending);
        assert!(old_pods_running(Some(&new), &[&old], &map));
        assert_eq!(recreate_scale_downs(&[&rs("a", 0, 2, 2, 2), &old]), steps(&[("a", 0)]));
    }
}
