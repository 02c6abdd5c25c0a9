//! What wakes a resting pod worker through its runtime: the container events of its pod, and a
//! reason to look at everything again (the event stream connecting or dropping). A worker is not
//! woken by the CREATED and STARTED events of the containers it just created and started itself,
//! so that a start costs one sync, not two. (Its own status coming back through the pod watch
//! does not wake it either: see `changed_for_worker`.)

use std::sync::Mutex;

use k8s_cri::v1 as cri;
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
}
