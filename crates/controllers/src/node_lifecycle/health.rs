//! Node health as the controller sees it: when it last heard from each node — a new Ready
//! heartbeat or a renewed Lease, timed on the controller's own clock as upstream's
//! `probeTimestamp` — and the conditions it posts once a node has been silent for its grace
//! period (upstream's `tryUpdateNodeHealth`, as functions of their inputs and the time).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use tokio::time::Instant;

pub const READY: &str = "Ready";
/// The one condition upstream leaves alone: it is managed on the control plane's side.
const NETWORK_UNAVAILABLE: &str = "NetworkUnavailable";
/// Conditions a silent node gets as Unknown even when it never posted them.
const KUBELET_CONDITIONS: &[&str] = &[READY, "MemoryPressure", "DiskPressure", "PIDPressure"];

/// What the controller last saw of one node.
#[derive(Clone, Debug, PartialEq)]
pub struct Health {
    /// When the controller last saw the node's Ready heartbeat or its Lease renewed.
    pub probe: Instant,
    /// The Ready condition's `lastHeartbeatTime` last seen; `None` while the node has no Ready
    /// condition.
    ready_heartbeat: Option<Option<Time>>,
    lease_renewed: Option<MicroTime>,
}

impl Health {
    /// Starts the clock again (upstream does so for every node when leaving full disruption).
    pub fn reset(&mut self, now: Instant) {
        self.probe = now;
    }
}

pub fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_)
}

/// The Ready condition's status (`True`, `False`, `Unknown`), if the node has one.
pub fn ready_status(node: &Node) -> Option<&str> {
    condition(node, READY).map(|c| c.status.as_str())
}

/// What the controller knows of `node` after seeing it (and its Lease) at `now`. A node seen for
/// the first time starts its grace period now, whatever its heartbeat says, so that a fresh
/// controller does not find every node silent; one that never posted a Ready condition counts
/// from its creation.
pub fn observe(
    prev: Option<&Health>,
    node: &Node,
    lease: Option<&Lease>,
    now: Instant,
    wall: jiff::Timestamp,
) -> Health {
    let heartbeat = condition(node, READY).map(|c| c.last_heartbeat_time.clone());
    let probe = match (prev, &heartbeat) {
        (None, None) => {
            let created = node.metadata.creation_timestamp.as_ref().map(|t| t.0).unwrap_or(wall);
            let age = wall.duration_since(created).try_into().unwrap_or(Duration::ZERO);
            now.checked_sub(age).unwrap_or(now)
        }
        (None, Some(_)) => now,
        (Some(p), _) if p.ready_heartbeat != heartbeat => now,
        (Some(p), _) => p.probe,
    };
    let renewed = lease.and_then(|l| l.spec.as_ref()?.renew_time.clone());
    let previous_renewal = prev.and_then(|p| p.lease_renewed.clone());
    let probe = match (&renewed, &previous_renewal) {
        (Some(new), Some(old)) if new > old => now,
        (Some(_), None) => now,
        _ => probe,
    };
    Health { probe, ready_heartbeat: heartbeat, lease_renewed: renewed.or(previous_renewal) }
}

/// The grace period a node gets: longer while it has never posted a Ready condition.
pub fn grace_period(node: &Node, monitor: Duration, startup: Duration) -> Duration {
    if condition(node, READY).is_some() { monitor } else { startup }
}

/// Whether the node has been silent for longer than `grace`.
pub fn is_silent(h: &Health, now: Instant, grace: Duration) -> bool {
    now > h.probe + grace
}

/// The conditions of a node silent past its grace period: Ready and every condition its agent
/// posts turn Unknown (`NodeStatusUnknown`, "Kubelet stopped posting node status."), and Ready
/// and the pressure conditions it never posted are added as Unknown (`NodeStatusNeverUpdated`).
/// `None` when the Ready condition is already so (upstream writes only when Ready changes).
pub fn silent_conditions(node: &Node, wall: jiff::Timestamp) -> Option<Vec<NodeCondition>> {
    let now = Time(wall);
    let mut conditions = node.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    for c in conditions.iter_mut().filter(|c| c.type_ != NETWORK_UNAVAILABLE) {
        if c.status != "Unknown" {
            c.status = "Unknown".into();
            c.reason = Some("NodeStatusUnknown".into());
            c.message = Some("Kubelet stopped posting node status.".into());
            c.last_transition_time = Some(now.clone());
        }
    }
    for type_ in KUBELET_CONDITIONS {
        if !conditions.iter().any(|c| c.type_ == *type_) {
            conditions.push(NodeCondition {
                type_: (*type_).into(),
                status: "Unknown".into(),
                reason: Some("NodeStatusNeverUpdated".into()),
                message: Some("Kubelet never posted node status.".into()),
                last_heartbeat_time: node.metadata.creation_timestamp.clone(),
                last_transition_time: Some(now.clone()),
            });
        }
    }
    let before = condition(node, READY);
    let after = conditions.iter().find(|c| c.type_ == READY);
    (before != after).then_some(conditions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use serde_json::json;

    fn ts(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    fn node(ready: Option<(&str, &str)>) -> Node {
        let mut conditions = vec![
            json!({"type": "MemoryPressure", "status": "False"}),
            json!({"type": "NetworkUnavailable", "status": "False"}),
        ];
        if let Some((status, heartbeat)) = ready {
            conditions.push(
                json!({"type": "Ready", "status": status, "lastHeartbeatTime": heartbeat, "reason": "KubeletReady"}),
            );
        }
        serde_json::from_value(json!({
            "metadata": {"name": "n", "creationTimestamp": "2025-01-01T00:00:00Z"},
            "status": {"conditions": conditions},
        }))
        .unwrap()
    }

    fn lease(renewed: &str) -> Lease {
        Lease {
            spec: Some(LeaseSpec { renew_time: Some(MicroTime(ts(renewed))), ..Default::default() }),
            ..Default::default()
        }
    }

    const MONITOR: Duration = Duration::from_secs(50);

    #[tokio::test(start_paused = true)]
    async fn a_node_seen_first_gets_a_whole_grace_period_however_old_its_heartbeat() {
        let wall = ts("2025-01-01T05:00:00Z");
        let n = node(Some(("True", "2025-01-01T01:00:00Z")));
        let h = observe(None, &n, Some(&lease("2025-01-01T01:00:00Z")), Instant::now(), wall);
        assert!(!is_silent(&h, Instant::now(), MONITOR));
        tokio::time::advance(MONITOR + Duration::from_secs(1)).await;
        let h = observe(Some(&h), &n, Some(&lease("2025-01-01T01:00:00Z")), Instant::now(), wall);
        assert!(is_silent(&h, Instant::now(), MONITOR));
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewed_lease_or_a_new_heartbeat_restarts_the_clock() {
        let wall = ts("2025-01-01T05:00:00Z");
        let start = Instant::now();
        let n = node(Some(("True", "2025-01-01T01:00:00Z")));
        let h = observe(None, &n, Some(&lease("2025-01-01T01:00:00Z")), start, wall);
        tokio::time::advance(Duration::from_secs(40)).await;
        let h = observe(Some(&h), &n, Some(&lease("2025-01-01T01:00:40Z")), Instant::now(), wall);
        assert_eq!(h.probe, start + Duration::from_secs(40));
        tokio::time::advance(Duration::from_secs(40)).await;
        let beat = node(Some(("True", "2025-01-01T01:01:20Z")));
        let h = observe(Some(&h), &beat, Some(&lease("2025-01-01T01:00:40Z")), Instant::now(), wall);
        assert_eq!(h.probe, start + Duration::from_secs(80));
        // The same lease and heartbeat again: the clock runs on.
        tokio::time::advance(Duration::from_secs(40)).await;
        let h = observe(Some(&h), &beat, Some(&lease("2025-01-01T01:00:40Z")), Instant::now(), wall);
        assert_eq!(h.probe, start + Duration::from_secs(80));
        // A lease that goes back in time is no renewal.
        let h = observe(Some(&h), &beat, Some(&lease("2025-01-01T00:00:00Z")), Instant::now(), wall);
        assert_eq!(h.probe, start + Duration::from_secs(80));
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_that_never_posted_status_counts_from_its_creation_with_the_startup_grace() {
        let n = node(None);
        let h = observe(None, &n, None, Instant::now(), ts("2025-01-01T00:00:30Z"));
        assert_eq!(grace_period(&n, MONITOR, Duration::from_secs(60)), Duration::from_secs(60));
        assert!(!is_silent(&h, Instant::now(), Duration::from_secs(60)));
        tokio::time::advance(Duration::from_secs(31)).await;
        assert!(is_silent(&h, Instant::now(), Duration::from_secs(60)));
    }

    #[test]
    fn a_silent_node_gets_unknown_conditions_except_network_unavailable() {
        let wall = ts("2025-01-01T05:00:00Z");
        let conditions = silent_conditions(&node(Some(("True", "2025-01-01T01:00:00Z"))), wall).unwrap();
        let by_type = |t: &str| conditions.iter().find(|c| c.type_ == t).unwrap();
        let ready = by_type("Ready");
        assert_eq!(ready.status, "Unknown");
        assert_eq!(ready.reason.as_deref(), Some("NodeStatusUnknown"));
        assert_eq!(ready.message.as_deref(), Some("Kubelet stopped posting node status."));
        assert_eq!(ready.last_transition_time, Some(Time(wall)));
        assert_eq!(ready.last_heartbeat_time, Some(Time(ts("2025-01-01T01:00:00Z"))));
        assert_eq!(by_type("MemoryPressure").status, "Unknown");
        assert_eq!(by_type("NetworkUnavailable").status, "False");
        let never = by_type("DiskPressure");
        assert_eq!((never.status.as_str(), never.reason.as_deref()), ("Unknown", Some("NodeStatusNeverUpdated")));
        // Already Unknown: nothing to write.
        assert!(silent_conditions(&node(Some(("Unknown", "2025-01-01T01:00:00Z"))), wall).is_none());
    }
}
