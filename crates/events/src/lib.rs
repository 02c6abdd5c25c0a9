//! Kubernetes Events recorded in the background through the API, repeats counted as client-go's recorder does.
//!
//! Events are core/v1 Events with a source (`{component: kubelet, host: NODE}` for the agent,
//! `default-scheduler` for the scheduler), written by one background task so that emitting never
//! slows the caller; a repeat of the same event on the same object bumps its `count` and
//! `lastTimestamp` instead of adding another. Each event carries the time it happened, not the
//! time it was written. When more events wait than the recorder's capacity, new ones are dropped,
//! as client-go's broadcaster drops them when its queue is full.

use std::collections::HashMap;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::mpsc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Type {
    Normal,
    Warning,
}

impl Type {
    fn as_str(self) -> &'static str {
        match self {
            Type::Normal => "Normal",
            Type::Warning => "Warning",
        }
    }
}

/// Who reports: `source.component` and `source.host` of every event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub component: String,
    /// The node, for a node's agent; `None` for cluster components.
    pub host: Option<String>,
}

/// The object an event is about (its `involvedObject`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Regarding {
    pub api_version: String,
    pub kind: String,
    /// Empty for cluster-scoped objects (their events go to `default`, as Kubernetes puts them).
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub field_path: String,
}

/// One event about any object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub regarding: Regarding,
    pub type_: Type,
    pub reason: String,
    pub message: String,
}

impl Event {
    /// An event about `obj` (a ReplicaSet, a Deployment, a Node, ...).
    pub fn about<K: kube::Resource<DynamicType = ()>>(obj: &K, type_: Type, reason: &str, message: String) -> Event {
        let meta = obj.meta();
        Event {
            regarding: Regarding {
                api_version: K::api_version(&()).into_owned(),
                kind: K::kind(&()).into_owned(),
                namespace: meta.namespace.clone().unwrap_or_default(),
                name: meta.name.clone().unwrap_or_default(),
                uid: meta.uid.clone().unwrap_or_default(),
                field_path: String::new(),
            },
            type_,
            reason: reason.into(),
            message,
        }
    }
}

/// One event about a pod (or one of its containers, through `field_path`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodEvent {
    pub namespace: String,
    pub pod_name: String,
    pub pod_uid: String,
    /// `spec.containers{app}`, `spec.initContainers{init}`, or empty for the pod itself.
    pub field_path: String,
    pub type_: Type,
    pub reason: String,
    pub message: String,
}

impl From<PodEvent> for Event {
    fn from(e: PodEvent) -> Event {
        Event {
            regarding: Regarding {
                api_version: "v1".into(),
                kind: "Pod".into(),
                namespace: e.namespace,
                name: e.pod_name,
                uid: e.pod_uid,
                field_path: e.field_path,
            },
            type_: e.type_,
            reason: e.reason,
            message: e.message,
        }
    }
}

/// Emits events; cheap to clone.
#[derive(Clone, Debug)]
pub struct Recorder {
    tx: mpsc::Sender<(Event, jiff::Timestamp)>,
}

impl Recorder {
    /// A recorder whose writer runs on the current Tokio runtime until every clone is dropped;
    /// at most `capacity` events wait to be written.
    pub fn spawn(client: kube::Client, source: Source, capacity: usize) -> Recorder {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        tokio::spawn(write_events(client, source, rx));
        Recorder { tx }
    }

    pub fn emit(&self, event: impl Into<Event>) {
        let event = event.into();
        let r = &event.regarding;
        tracing::debug!(kind = %r.kind, name = %r.name, reason = %event.reason, message = %event.message, "event");
        if let Err(mpsc::error::TrySendError::Full((e, _))) = self.tx.try_send((event, jiff::Timestamp::now())) {
            tracing::debug!(name = %e.regarding.name, reason = %e.reason, "event queue full; event dropped");
        }
    }
}

/// Key for aggregation: the same reason and message about the same object, hashed (the cache
/// holds thousands of entries, and four strings each would be most of it).
fn key(e: &Event) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    let r = &e.regarding;
    BuildHasherDefault::<DefaultHasher>::default().hash_one((&r.uid, &r.name, &r.field_path, &e.reason, &e.message))
}

async fn write_events(client: kube::Client, source: Source, mut rx: mpsc::Receiver<(Event, jiff::Timestamp)>) {
    // Event name and count of each event written, to count repeats; bounded by dropping all
    // entries now and then (a repeat after that starts a new event, as kubelet's cache does).
    let mut written: HashMap<u64, (String, i32)> = HashMap::new();
    let instance = source.host.clone().unwrap_or_else(|| source.component.clone());
    while let Some((e, at)) = rx.recv().await {
        if written.len() > 4096 {
            written.clear();
        }
        let r = &e.regarding;
        let namespace = if r.namespace.is_empty() { "default" } else { r.namespace.as_str() };
        let api: Api<core::Event> = Api::namespaced(client.clone(), namespace);
        let key = key(&e);
        let now = Time(at);
        if let Some((name, count)) = written.get_mut(&key) {
            let patch = serde_json::json!({"count": *count + 1, "lastTimestamp": now});
            match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    *count += 1;
                    continue;
                }
                Err(err) => tracing::debug!(error = %err, "event to bump is gone; writing a new one"),
            }
        }
        let name = format!("{}.{:x}", r.name, now.0.as_nanosecond());
        let event = core::Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.to_string()),
                ..Default::default()
            },
            involved_object: core::ObjectReference {
                api_version: Some(r.api_version.clone()),
                kind: Some(r.kind.clone()),
                name: Some(r.name.clone()),
                namespace: Some(r.namespace.clone()).filter(|n| !n.is_empty()),
                uid: Some(r.uid.clone()),
                field_path: Some(r.field_path.clone()).filter(|f| !f.is_empty()),
                ..Default::default()
            },
            reason: Some(e.reason.clone()),
            message: Some(e.message.clone()),
            type_: Some(e.type_.as_str().into()),
            count: Some(1),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            source: Some(core::EventSource { component: Some(source.component.clone()), host: source.host.clone() }),
            reporting_component: Some(source.component.clone()),
            reporting_instance: Some(instance.clone()),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => {
                written.insert(key, (name, 1));
            }
            Err(err) => {
                tracing::warn!(name = %e.regarding.name, reason = %e.reason, error = %err, "could not record an event")
            }
        }
    }
}
