//! What wakes a resting pod worker besides its timer: the runtime's container events for its
//! pod, a reason to look at everything again (the event stream connecting or dropping), and
//! pod updates from the API. A worker is not woken by what it caused itself — the CREATED and
//! STARTED events of containers it just created and started, or its own status coming back
//! through the watch — so that each start costs one sync, not three (kubelet's pod config also
//! ignores status-only updates).

use std::sync::Mutex;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1 as core;
use tokio::sync::Notify;

/// Most self-caused events a worker waits for; older ones are forgotten (a forgotten one only
/// costs a sync).
const MAX_EXPECTED: usize = 16;

/// A container event: the container's ID and its `ContainerEventType`.
pub type ContainerEvent = (String, i32);

/// The wake-up of one worker, shared with the event listener.
#[derive(Debug, Default)]
pub struct Wake {
    notify: Notify,
    pending: Mutex<Pending>,
}

#[derive(Debug, Default, PartialEq)]
struct Pending {
    everything: bool,
    events: Vec<ContainerEvent>,
}

impl Wake {
    /// The worker should look at everything again.
    pub fn look(&self) {
        self.lock().everything = true;
        self.notify.notify_one();
    }

    /// A container of the worker's pod changed.
    pub fn container_event(&self, id: String, kind: i32) {
        self.lock().events.push((id, kind));
        self.notify.notify_one();
    }

    /// Waits for the next wake-up.
    pub async fn notified(&self) {
        self.notify.notified().await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The events a worker caused and will be told about.
#[derive(Debug, Default)]
pub struct Expected(Vec<ContainerEvent>);

impl Expected {
    pub fn created(&mut self, id: &str) {
        self.push(id, cri::ContainerEventType::ContainerCreatedEvent);
    }

    pub fn started(&mut self, id: &str) {
        self.push(id, cri::ContainerEventType::ContainerStartedEvent);
    }

    fn push(&mut self, id: &str, kind: cri::ContainerEventType) {
        if self.0.len() >= MAX_EXPECTED {
            self.0.remove(0);
        }
        self.0.push((id.to_string(), kind as i32));
    }

    /// Takes what woke the worker: true when something in it needs a sync, that is anything
    /// but events this worker expected (which are then no longer expected).
    pub fn needs_sync(&mut self, wake: &Wake) -> bool {
        let pending = std::mem::take(&mut *wake.lock());
        let mut needed = pending.everything;
        for event in pending.events {
            match self.0.iter().position(|e| *e == event) {
                Some(i) => {
                    self.0.remove(i);
                }
                None => needed = true,
            }
        }
        needed
    }
}

/// True when `new` differs from `old` in nothing a worker acts on: only in its status (or the
/// bookkeeping that comes with any write).
pub fn only_status_changed(old: &core::Pod, new: &core::Pod) -> bool {
    let meta = |p: &core::Pod| {
        let mut m = p.metadata.clone();
        m.resource_version = None;
        m.managed_fields = None;
        m
    };
    old.spec == new.spec && meta(old) == meta(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cri::ContainerEventType as Kind;

    #[test]
    fn the_events_of_containers_the_worker_created_and_started_need_no_sync() {
        let (wake, mut expected) = (Wake::default(), Expected::default());
        expected.created("a");
        expected.started("a");
        wake.container_event("a".into(), Kind::ContainerCreatedEvent as i32);
        wake.container_event("a".into(), Kind::ContainerStartedEvent as i32);
        assert!(!expected.needs_sync(&wake));
        assert!(expected.0.is_empty(), "each expected event is met once");
    }

    #[test]
    fn a_container_stopping_or_an_event_no_longer_expected_needs_a_sync() {
        let (wake, mut expected) = (Wake::default(), Expected::default());
        expected.started("a");
        wake.container_event("a".into(), Kind::ContainerStartedEvent as i32);
        wake.container_event("a".into(), Kind::ContainerStoppedEvent as i32);
        assert!(expected.needs_sync(&wake));
        wake.container_event("a".into(), Kind::ContainerStartedEvent as i32);
        assert!(expected.needs_sync(&wake), "a second start of the same container was not caused by the worker");
    }

    #[test]
    fn looking_at_everything_needs_a_sync_even_with_only_expected_events() {
        let (wake, mut expected) = (Wake::default(), Expected::default());
        expected.created("a");
        wake.container_event("a".into(), Kind::ContainerCreatedEvent as i32);
        wake.look();
        assert!(expected.needs_sync(&wake));
        assert!(!expected.needs_sync(&wake), "what woke the worker is taken once");
    }

    #[test]
    fn only_the_oldest_expected_events_are_forgotten() {
        let (wake, mut expected) = (Wake::default(), Expected::default());
        for i in 0..=MAX_EXPECTED {
            expected.started(&i.to_string());
        }
        wake.container_event(MAX_EXPECTED.to_string(), Kind::ContainerStartedEvent as i32);
        assert!(!expected.needs_sync(&wake));
        wake.container_event("0".into(), Kind::ContainerStartedEvent as i32);
        assert!(expected.needs_sync(&wake));
    }

    #[test]
    fn a_pod_whose_status_alone_changed_needs_no_sync_but_a_deletion_or_label_does() {
        let mut old = core::Pod::default();
        old.metadata.resource_version = Some("1".into());
        old.spec = Some(core::PodSpec { node_name: Some("n".into()), ..Default::default() });
        let mut new = old.clone();
        new.metadata.resource_version = Some("2".into());
        new.status = Some(core::PodStatus { phase: Some("Running".into()), ..Default::default() });
        assert!(only_status_changed(&old, &new));
        let mut deleting = new.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()));
        assert!(!only_status_changed(&old, &deleting));
        let mut labelled = new.clone();
        labelled.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        assert!(!only_status_changed(&old, &labelled));
    }
}
