//! The fan-out of store events to HTTP watchers: one store watch per resource type, whose
//! events go only to the watchers that may select them.
//!
//! Each watcher registers under a [`Slot`]: its namespace (or all) and, when its field selector
//! has an equality term on a field Kubernetes indexes (`spec.nodeName` of pods, `metadata.name`),
//! that value. An event goes to the slots its old and new objects fall in, so with thousands of
//! agents each watching the pods of its node, one pod update wakes one agent's watch, not all.
//! Watchers still apply their whole selectors: the index only narrows who looks.
//!
//! The last [`RECENT_EVENTS`] events stay so that a watch resuming just behind the hub replays
//! them; one from further back reads the store itself (see [`WatchHub::subscribe`]) until it has
//! caught up, and then registers here.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use berth_api::ResourceType;
use berth_api::resources::PODS;
use berth_api::selector::FieldSelector;
use berth_store::{Event, WatchItem};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;

use crate::watch_events::{Decoded, pod_node_name};
use crate::{ApiState, objects};

/// Events each resource type keeps for watches resuming from a recent revision: several times
/// [`WATCHER_QUEUE`], so that a watcher cut off for falling behind can resume from here.
pub const RECENT_EVENTS: usize = 4000;

/// Events a watcher may leave unread before it is cut off: a client that stops reading must
/// not make the server hold every later event for it.
pub const WATCHER_QUEUE: usize = 1000;

/// Where a watcher registers: its namespace (`None`: all, or a cluster-scoped type) and the
/// indexed field value its selector requires, if any.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    namespace: Option<String>,
    index: Index,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Index {
    All,
    Name(String),
    Node(String),
}

impl Slot {
    /// The slot of a watch of `rt` in `namespace` with field selector `fields` (as the query
    /// spells it, already validated).
    pub fn of(rt: &ResourceType, namespace: Option<&str>, fields: Option<&str>) -> Slot {
        let namespace = namespace.filter(|_| rt.namespaced).map(str::to_string);
        let sel = fields.and_then(|f| FieldSelector::parse(f).ok());
        let equal = |field: &str| {
            sel.as_ref().and_then(|s| s.terms().iter().find(|t| !t.not && t.field == field).map(|t| t.value.clone()))
        };
        // A missing nodeName reads as "", so `spec.nodeName=` (unscheduled pods) indexes too.
        let index = match (is_pods(rt).then(|| equal("spec.nodeName")).flatten(), equal("metadata.name")) {
            (Some(node), _) => Index::Node(node),
            (None, Some(name)) => Index::Name(name),
            (None, None) => Index::All,
        };
        Slot { namespace, index }
    }
}

impl Slot {
    /// Whether an event may concern a watcher of this slot, told without decoding its objects
    /// (from the key, and a pod's `spec.nodeName` alone): a watch catching up on the store's
    /// history skips the other events instead of decoding every event of the type.
    pub fn may_hold(&self, rt: &ResourceType, ev: &Event) -> bool {
        let (namespace, name) = namespace_and_name(rt, &ev.key);
        if self.namespace.as_deref().is_some_and(|ns| namespace != Some(ns)) {
            return false;
        }
        match &self.index {
            Index::All => true,
            Index::Name(n) => n == name,
            // An object that does not read as a pod is left to the watcher's own decoding.
            Index::Node(n) => [ev.value.as_deref(), ev.prev_value.as_deref()]
                .into_iter()
                .flatten()
                .any(|bytes| pod_node_name(bytes).is_none_or(|node| node == *n)),
        }
    }
}

/// The namespace (for a namespaced type) and name an object's store key spells.
fn namespace_and_name<'k>(rt: &ResourceType, key: &'k str) -> (Option<&'k str>, &'k str) {
    let rest = key.strip_prefix(&objects::prefix(rt, None)).unwrap_or(key);
    match rest.split_once('/') {
        Some((ns, name)) if rt.namespaced => (Some(ns), name),
        _ => (None, rest),
    }
}

fn is_pods(rt: &ResourceType) -> bool {
    std::ptr::eq(rt, &PODS)
}

/// What a watcher receives from its dispatcher.
pub enum Message {
    Event(Arc<Event>, Arc<Decoded>),
    /// The dispatcher's store watch failed: the watch ends with this ERROR line.
    End(Bytes),
}

/// A watcher's registration: the buffered events after its start, then the live ones.
/// Dropping it unregisters the watcher.
pub struct Subscription {
    pub replay: VecDeque<(Arc<Event>, Arc<Decoded>)>,
    pub live: mpsc::Receiver<Message>,
    dispatcher: Arc<Dispatcher>,
    slot: Slot,
    id: u64,
}

impl Subscription {
    /// The revision up to which the dispatcher has handed out every event (those this watcher
    /// selects are already queued for it): what a bookmark may report.
    pub fn progress(&self) -> i64 {
        self.dispatcher.progress.load(Ordering::Acquire)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut inner = self.dispatcher.lock();
        if let Some(slot) = inner.watchers.get_mut(&self.slot) {
            slot.remove(&self.id);
            if slot.is_empty() {
                inner.watchers.remove(&self.slot);
            }
        }
    }
}

/// The dispatchers of every watched resource type.
#[derive(Default)]
pub struct WatchHub {
    dispatchers: tokio::sync::Mutex<HashMap<usize, Arc<Dispatcher>>>,
}

fn type_id(rt: &'static ResourceType) -> usize {
    std::ptr::from_ref(rt) as usize
}

impl WatchHub {
    /// Registers a watcher of `rt` for the events after revision `after`, starting the type's
    /// dispatcher if needed. `None`: the hub cannot serve it and the watch reads the store
    /// itself, as when `after` is older than the buffered events or was compacted (the store
    /// then answers `410 Gone`), or the store watch cannot be opened (the store reports why).
    ///
    /// A start newer than the hub's position (a client that just wrote) registers at once: the
    /// hub sees every event of the type in order, and those up to `after` are not sent to it.
    pub async fn subscribe(
        &self,
        state: &Arc<ApiState>,
        rt: &'static ResourceType,
        after: i64,
        slot: Slot,
    ) -> Option<Subscription> {
        // History up to the compacted revision is gone: `410 Gone`, as without the hub.
        if !matches!(state.store.is_compacted(after).await, Ok(false)) {
            return None;
        }
        let dispatcher = self.dispatcher(state, rt).await?;
        dispatcher.register(&state.watch_events, after, slot)
    }

    /// How many watches of `rt` the hub feeds (not those reading the store themselves).
    pub async fn watchers(&self, rt: &'static ResourceType) -> usize {
        let dispatcher = self.dispatchers.lock().await.get(&type_id(rt)).cloned();
        dispatcher.map_or(0, |d| d.lock().watchers.values().map(HashMap::len).sum())
    }

    async fn dispatcher(&self, state: &Arc<ApiState>, rt: &'static ResourceType) -> Option<Arc<Dispatcher>> {
        let mut dispatchers = self.dispatchers.lock().await;
        if let Some(d) = dispatchers.get(&type_id(rt)) {
            return Some(d.clone());
        }
        let prefix = objects::prefix(rt, None);
        let start = state.store.current_revision().await.ok()?;
        let events = match state.store.watch_with_progress(&prefix, start).await {
            Ok(events) => events,
            Err(e) => {
                tracing::info!(resource = rt.plural, "watch fan-out unavailable: {e}");
                return None;
            }
        };
        let dispatcher = Arc::new(Dispatcher {
            rt,
            progress: AtomicI64::new(start),
            inner: Mutex::new(Inner {
                recent: VecDeque::new(),
                floor: start,
                watchers: HashMap::new(),
                next_id: 0,
                closed: false,
            }),
        });
        dispatchers.insert(type_id(rt), dispatcher.clone());
        tokio::spawn(dispatcher.clone().run(Arc::downgrade(state), events));
        Some(dispatcher)
    }

    async fn remove(&self, rt: &'static ResourceType, dispatcher: &Arc<Dispatcher>) {
        let mut dispatchers = self.dispatchers.lock().await;
        if dispatchers.get(&type_id(rt)).is_some_and(|d| Arc::ptr_eq(d, dispatcher)) {
            dispatchers.remove(&type_id(rt));
        }
    }
}

/// One resource type's store watch and its watchers.
struct Dispatcher {
    rt: &'static ResourceType,
    /// The revision up to which every event of the type has been handed out to the watchers:
    /// the last event's, or a later one the store reported as progress.
    progress: AtomicI64,
    /// Registration and dispatch hold this lock, so a watcher gets each event exactly once:
    /// from the buffer if dispatched before it registered, live after.
    inner: Mutex<Inner>,
}

struct Inner {
    recent: VecDeque<Recent>,
    /// Every event of the type after this revision is in `recent` or still to come.
    floor: i64,
    watchers: HashMap<Slot, HashMap<u64, Watcher>>,
    next_id: u64,
    closed: bool,
}

struct Watcher {
    tx: mpsc::Sender<Message>,
    after: i64,
}

/// A buffered event and the slots it falls in.
struct Recent {
    ev: Arc<Event>,
    slots: Vec<Slot>,
}

impl Dispatcher {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(
        self: Arc<Self>,
        shared: &crate::watch_events::SharedEvents,
        after: i64,
        slot: Slot,
    ) -> Option<Subscription> {
        let mut inner = self.lock();
        if inner.closed || after < inner.floor {
            return None;
        }
        let replay = inner
            .recent
            .iter()
            .filter(|r| r.ev.revision > after && r.slots.contains(&slot))
            .map(|r| (r.ev.clone(), shared.get(self.rt, &r.ev)))
            .collect();
        // One more than the queue: the slot an ending message always finds free.
        let (tx, live) = mpsc::channel(WATCHER_QUEUE + 1);
        let id = inner.next_id;
        inner.next_id += 1;
        inner.watchers.entry(slot.clone()).or_default().insert(id, Watcher { tx, after });
        drop(inner);
        Some(Subscription { replay, live, dispatcher: self, slot, id })
    }

    /// Follows the store watch until it fails or the API state is gone.
    async fn run(self: Arc<Self>, state: Weak<ApiState>, mut events: berth_store::ProgressStream) {
        let rt = self.rt;
        let end = loop {
            let item = events.next().await;
            let Some(state) = state.upgrade() else { return };
            match item {
                Some(Ok(WatchItem::Event(ev))) => self.dispatch(&state, ev),
                // Nothing of the type up to `revision` is left to dispatch: bookmarks may say so.
                Some(Ok(WatchItem::Progress(revision))) => {
                    self.progress.fetch_max(revision, Ordering::AcqRel);
                }
                Some(Err(e)) => {
                    tracing::info!(resource = rt.plural, "watch fan-out stopped, its watches end: {e}");
                    break (state, Some(crate::watch::expired_line(rt, e)));
                }
                None => {
                    tracing::info!(resource = rt.plural, "watch fan-out stopped: the store watch ended");
                    break (state, None);
                }
            }
        };
        let (state, line) = end;
        // The next watch of the type starts a new dispatcher.
        state.watch_hub.remove(rt, &self).await;
        let mut inner = self.lock();
        inner.closed = true;
        for (_, watchers) in inner.watchers.drain() {
            for (_, w) in watchers {
                if let Some(line) = &line {
                    let _ = w.tx.try_send(Message::End(line.clone()));
                }
            }
        }
    }

    fn dispatch(&self, state: &ApiState, ev: Event) {
        let rt = self.rt;
        let ev = Arc::new(ev);
        let decoded = state.watch_events.get(rt, &ev);
        let slots = slots_of(rt, &ev, &decoded);
        let mut inner = self.lock();
        for slot in &slots {
            let Some(watchers) = inner.watchers.get_mut(slot) else { continue };
            watchers.retain(|_, w| {
                if ev.revision <= w.after {
                    return !w.tx.is_closed();
                }
                if w.tx.capacity() <= 1 {
                    let unread = w.tx.max_capacity() - w.tx.capacity();
                    tracing::info!(resource = rt.plural, "watch closed: watcher too slow: {unread} events unread");
                    return false;
                }
                w.tx.try_send(Message::Event(ev.clone(), decoded.clone())).is_ok()
            });
            if watchers.is_empty() {
                inner.watchers.remove(slot);
            }
        }
        if inner.recent.len() >= RECENT_EVENTS
            && let Some(oldest) = inner.recent.pop_front()
        {
            inner.floor = oldest.ev.revision;
        }
        let revision = ev.revision;
        inner.recent.push_back(Recent { ev, slots });
        // After the sends: a watcher that reads this revision has what it selects queued.
        self.progress.fetch_max(revision, Ordering::AcqRel);
    }
}

/// The slots an event falls in: its namespace and all namespaces, each unindexed, by the
/// object's name, and by the old and the new object's node for pods.
fn slots_of(rt: &'static ResourceType, ev: &Event, decoded: &Decoded) -> Vec<Slot> {
    let (namespace, name) = namespace_and_name(rt, &ev.key);
    let mut indexes = vec![Index::All, Index::Name(name.to_string())];
    if is_pods(rt) {
        for n in [decoded.new_node(ev), decoded.old_node(ev)].into_iter().flatten() {
            let n = Index::Node(n.to_string());
            if !indexes.contains(&n) {
                indexes.push(n);
            }
        }
    }
    let mut slots = Vec::with_capacity(indexes.len() * 2);
    for ns in [namespace.map(str::to_string), None].into_iter().take(if namespace.is_some() { 2 } else { 1 }) {
        for index in &indexes {
            slots.push(Slot { namespace: ns.clone(), index: index.clone() });
        }
    }
    slots
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_api::resources::{NAMESPACES, SERVICES};

    #[test]
    fn a_slot_tells_from_the_key_and_node_name_alone_which_events_may_concern_it() {
        let ev = |key: &str, value: Option<&str>, prev: Option<&str>| Event {
            kind: berth_store::EventKind::Put,
            key: key.into(),
            revision: 2,
            create_revision: 1,
            value: value.map(|v| v.as_bytes().to_vec()),
            prev_value: prev.map(|v| v.as_bytes().to_vec()),
        };
        let bound = r#"{"metadata":{"name":"a"},"spec":{"nodeName":"n1","containers":[]}}"#;
        let pending = r#"{"metadata":{"name":"a"},"spec":{"containers":[]}}"#;
        let key = "/registry/pods/ns/a";
        let n1 = Slot::of(&PODS, None, Some("spec.nodeName=n1"));
        assert!(n1.may_hold(&PODS, &ev(key, Some(bound), None)));
        assert!(n1.may_hold(&PODS, &ev(key, Some(pending), Some(bound))), "leaving the node");
        assert!(!n1.may_hold(&PODS, &ev(key, Some(pending), None)));
        assert!(!Slot::of(&PODS, None, Some("spec.nodeName=n2")).may_hold(&PODS, &ev(key, Some(bound), None)));
        assert!(Slot::of(&PODS, None, Some("spec.nodeName=")).may_hold(&PODS, &ev(key, Some(pending), None)));
        assert!(!Slot::of(&PODS, Some("other"), None).may_hold(&PODS, &ev(key, Some(bound), None)));
        assert!(Slot::of(&PODS, Some("ns"), Some("metadata.name=a")).may_hold(&PODS, &ev(key, Some(bound), None)));
        assert!(!Slot::of(&PODS, None, Some("metadata.name=b")).may_hold(&PODS, &ev(key, Some(bound), None)));
        assert!(n1.may_hold(&PODS, &ev(key, Some("not json"), None)), "undecodable: left to the watcher");
    }

    #[test]
    fn a_node_or_name_equality_picks_the_index() {
        let s = Slot::of(&PODS, Some("ns"), Some("spec.nodeName=n1,status.phase!=Failed"));
        assert_eq!(s, Slot { namespace: Some("ns".into()), index: Index::Node("n1".into()) });
        assert_eq!(Slot::of(&PODS, None, Some("spec.nodeName=")).index, Index::Node(String::new()));
        assert_eq!(Slot::of(&PODS, None, Some("spec.nodeName!=n1")).index, Index::All);
        assert_eq!(Slot::of(&SERVICES, None, Some("metadata.name=x")).index, Index::Name("x".into()));
        assert_eq!(Slot::of(&NAMESPACES, Some("ignored"), None), Slot { namespace: None, index: Index::All });
    }

    #[test]
    fn a_pod_event_falls_in_the_slots_of_its_old_and_new_node() {
        let ev = Event {
            kind: berth_store::EventKind::Put,
            key: "/registry/pods/ns/p".into(),
            revision: 5,
            create_revision: 4,
            value: Some(br#"{"metadata":{"name":"p"},"spec":{"nodeName":"n1"}}"#.to_vec()),
            prev_value: Some(br#"{"metadata":{"name":"p"},"spec":{}}"#.to_vec()),
        };
        let slots = slots_of(&PODS, &ev, &Decoded::default());
        for (ns, index) in [
            (Some("ns"), Index::All),
            (None, Index::All),
            (Some("ns"), Index::Name("p".into())),
            (None, Index::Node("n1".into())),
            (None, Index::Node(String::new())),
        ] {
            assert!(
                slots.contains(&Slot { namespace: ns.map(str::to_string), index: index.clone() }),
                "{ns:?} {index:?}"
            );
        }
        assert_eq!(slots.len(), 8);
    }
}
