//! Watch events decoded once for all the watchers that receive them.
//!
//! Every change reaches each watch of its resource: on one node the scheduler, the controllers,
//! the agent and any `kubectl get -w` all watch pods. Each watcher used to decode the stored new
//! and old values and encode the event line itself, so one pod update cost as many JSON decodes
//! and encodes as there were watchers. Here the first watcher to see an event decodes it (and
//! encodes its line for the plain-object output) and the others reuse the result. Only the last
//! [`RECENT`] events are kept: watchers handle an event within moments of each other, and one
//! that falls behind decodes for itself. Watches fed by the [watch hub](crate::watch_hub) get the
//! decoding along with the event, so theirs is shared however far behind they are.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

use berth_api::ResourceType;
use berth_store::Event;
use bytes::Bytes;
use serde_json::Value;

use crate::objects;

/// How many recent events stay decoded; small, since decoded objects are several times larger
/// than their JSON.
const RECENT: usize = 32;

/// One write as a resource type shows it: which type (by identity), which key, which revision.
/// A revision alone is not enough: one transaction may write several keys.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct EventId {
    rt: usize,
    revision: i64,
    key: String,
}

/// The recently decoded events.
#[derive(Default)]
pub struct SharedEvents {
    recent: Mutex<Recent>,
}

#[derive(Default)]
struct Recent {
    by_id: HashMap<EventId, Arc<Decoded>>,
    order: VecDeque<EventId>,
}

impl SharedEvents {
    /// The shared decoding of `ev` as resource type `rt` sees it.
    pub fn get(&self, rt: &'static ResourceType, ev: &Event) -> Arc<Decoded> {
        let id = EventId { rt: std::ptr::from_ref(rt) as usize, revision: ev.revision, key: ev.key.clone() };
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = recent.by_id.get(&id) {
            return found.clone();
        }
        let decoded = Arc::new(Decoded::default());
        if recent.order.len() >= RECENT
            && let Some(oldest) = recent.order.pop_front()
        {
            recent.by_id.remove(&oldest);
        }
        recent.order.push_back(id.clone());
        recent.by_id.insert(id, decoded.clone());
        decoded
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.recent.lock().unwrap().by_id.len()
    }
}

/// An event's objects and lines, each computed by the first watcher that needs it.
#[derive(Default)]
pub struct Decoded {
    new: OnceLock<Option<Value>>,
    old: OnceLock<Option<Value>>,
    new_node: OnceLock<Option<String>>,
    old_node: OnceLock<Option<String>>,
    /// Encoded lines of the whole object, by event type (`ADDED`, `MODIFIED`, `DELETED`).
    lines: Mutex<Vec<(&'static str, Bytes)>>,
}

impl Decoded {
    /// The object after the write; `None` for a delete or an undecodable value.
    pub fn new_object(&self, rt: &ResourceType, ev: &Event) -> Option<&Value> {
        self.new.get_or_init(|| ev.value.as_deref().and_then(|b| objects::decode(rt, b, ev.revision).ok())).as_ref()
    }

    /// The object before the write, with the event's revision as Kubernetes reports it.
    pub fn old_object(&self, rt: &ResourceType, ev: &Event) -> Option<&Value> {
        self.old
            .get_or_init(|| ev.prev_value.as_deref().and_then(|b| objects::decode(rt, b, ev.revision).ok()))
            .as_ref()
    }

    /// A pod's `spec.nodeName` after the write ("" when unset), read without decoding the rest;
    /// `None` for a delete or an undecodable value.
    pub fn new_node(&self, ev: &Event) -> Option<&str> {
        self.new_node.get_or_init(|| ev.value.as_deref().and_then(pod_node_name)).as_deref()
    }

    /// A pod's `spec.nodeName` before the write, as [`Decoded::new_node`].
    pub fn old_node(&self, ev: &Event) -> Option<&str> {
        self.old_node.get_or_init(|| ev.prev_value.as_deref().and_then(pod_node_name)).as_deref()
    }

    /// The line of event type `kind` carrying `object` whole, encoded once per type.
    pub fn object_line(&self, kind: &'static str, encode: impl FnOnce() -> Bytes) -> Bytes {
        self.try_object_line(kind, || Some(encode())).expect("encoded")
    }

    /// [`Decoded::object_line`] with an encoding that may not apply (`None`, not kept).
    pub fn try_object_line(&self, kind: &'static str, encode: impl FnOnce() -> Option<Bytes>) -> Option<Bytes> {
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, line)) = lines.iter().find(|(k, _)| *k == kind) {
            return Some(line.clone());
        }
        let line = encode()?;
        lines.push((kind, line.clone()));
        Some(line)
    }
}

/// A pod's `spec.nodeName` ("" when unset) from its JSON, without building the rest of it;
/// `None` if the bytes are not an object.
pub fn pod_node_name(bytes: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Pod {
        spec: Option<Spec>,
    }
    #[derive(serde::Deserialize)]
    struct Spec {
        #[serde(rename = "nodeName")]
        node_name: Option<String>,
    }
    let pod: Pod = serde_json::from_slice(bytes).ok()?;
    Some(pod.spec.and_then(|s| s.node_name).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_api::resources::PODS;
    use berth_store::EventKind;

    fn event(revision: i64, key: &str, value: &str, prev: Option<&str>) -> Event {
        Event {
            kind: EventKind::Put,
            key: key.into(),
            revision,
            create_revision: 1,
            value: Some(value.as_bytes().to_vec()),
            prev_value: prev.map(|p| p.as_bytes().to_vec()),
        }
    }

    #[test]
    fn watchers_of_one_event_share_its_decoding_and_its_line() {
        let shared = SharedEvents::default();
        let ev = event(7, "/registry/pods/ns/a", r#"{"metadata":{"name":"a"}}"#, Some(r#"{"metadata":{"name":"a0"}}"#));
        let first = shared.get(&PODS, &ev);
        let second = shared.get(&PODS, &ev);
        assert!(Arc::ptr_eq(&first, &second));
        let obj = first.new_object(&PODS, &ev).unwrap();
        assert_eq!(obj["metadata"]["resourceVersion"], "7");
        assert_eq!(obj["kind"], "Pod");
        assert_eq!(second.old_object(&PODS, &ev).unwrap()["metadata"]["name"], "a0");
        let mut encodes = 0;
        for _ in 0..3 {
            let line = second.object_line("MODIFIED", || {
                encodes += 1;
                Bytes::from_static(b"line\n")
            });
            assert_eq!(&line[..], b"line\n");
        }
        assert_eq!(encodes, 1);
    }

    #[test]
    fn another_key_at_the_same_revision_is_another_event() {
        let shared = SharedEvents::default();
        let a = shared.get(&PODS, &event(7, "/registry/pods/ns/a", "{}", None));
        let b = shared.get(&PODS, &event(7, "/registry/pods/ns/b", "{}", None));
        assert!(!Arc::ptr_eq(&a, &b));
    }

    #[test]
    fn only_the_most_recent_events_are_kept() {
        let shared = SharedEvents::default();
        let first = event(1, "/registry/pods/ns/a", "{}", None);
        let kept = shared.get(&PODS, &first);
        for rev in 2..=(RECENT as i64 + 5) {
            shared.get(&PODS, &event(rev, "/registry/pods/ns/a", "{}", None));
        }
        assert_eq!(shared.len(), RECENT);
        assert!(!Arc::ptr_eq(&kept, &shared.get(&PODS, &first)), "the oldest event was dropped and decoded anew");
    }

    #[test]
    fn a_delete_has_no_new_object_and_a_creation_no_old_one() {
        let shared = SharedEvents::default();
        let mut ev = event(3, "/registry/pods/ns/a", "{}", None);
        assert!(shared.get(&PODS, &ev).old_object(&PODS, &ev).is_none());
        ev.kind = EventKind::Delete;
        ev.revision = 4;
        ev.prev_value = ev.value.take();
        let d = shared.get(&PODS, &ev);
        assert!(d.new_object(&PODS, &ev).is_none());
        assert!(d.old_object(&PODS, &ev).is_some());
    }
}
