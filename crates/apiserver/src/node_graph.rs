//! What the pods bound to each node reference (secrets, configmaps, claims, service accounts),
//! kept up to date from the pods' watch so that the node authorizer answers a node's read of
//! one of them without reading every pod of the namespace.
//!
//! The index follows the store a moment behind: a pod bound just now may not be in it yet when
//! its node already asks for its volumes. So the index only ever allows; whatever it does not
//! find is decided from the store as before ([`crate::authz::decide`]). Kubernetes' node
//! authorizer keeps the same kind of graph from its informers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_api::resources::PODS;
use berth_store::{Event, ListOptions};
use k8s_openapi::api::core::v1::Pod;

use crate::authz::{NodeGraph, PodReferences, Referenced};
use crate::watch_hub::{Message, Slot};
use crate::{ApiState, objects};

/// How long after a failure the index is built again.
const RETRY: Duration = Duration::from_secs(1);

/// One reference of a pod: what it names, in the pod's namespace.
type Reference = (Referenced, String, String);

/// The index; empty (and not ready) until [`run`] has read every pod.
#[derive(Default)]
pub struct NodeReferences {
    inner: Mutex<Index>,
}

#[derive(Default)]
struct Index {
    ready: bool,
    /// Each bound pod's node and references, by store key.
    pods: HashMap<String, (String, Vec<Reference>)>,
    /// How many pods on a node hold each reference.
    counts: HashMap<String, HashMap<Reference, usize>>,
}

impl Index {
    fn set(&mut self, key: &str, entry: Option<(String, Vec<Reference>)>) {
        if let Some((node, refs)) = self.pods.remove(key) {
            let on_node = self.counts.entry(node.clone()).or_default();
            for r in refs {
                if let Some(n) = on_node.get_mut(&r) {
                    *n -= 1;
                    if *n == 0 {
                        on_node.remove(&r);
                    }
                }
            }
            if on_node.is_empty() {
                self.counts.remove(&node);
            }
        }
        if let Some((node, refs)) = entry {
            let on_node = self.counts.entry(node.clone()).or_default();
            for r in &refs {
                *on_node.entry(r.clone()).or_default() += 1;
            }
            self.pods.insert(key.to_string(), (node, refs));
        }
    }
}

impl NodeReferences {
    /// Whether a pod bound to `node` is known to reference `kind` `namespace/name`. `false`
    /// also when the index does not know yet: the caller then asks the store.
    pub fn references(&self, node: &str, kind: Referenced, namespace: &str, name: &str) -> bool {
        let index = self.lock();
        index.ready
            && index
                .counts
                .get(node)
                .is_some_and(|refs| refs.contains_key(&(kind, namespace.to_string(), name.to_string())))
    }

    /// The index's view of `node`, as the authorizer takes it.
    pub fn graph<'a>(&'a self, node: &'a str) -> impl NodeGraph + 'a {
        move |kind: Referenced, namespace: &str, name: &str| self.references(node, kind, namespace, name)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The node and references of a pod from its stored bytes; `None` for a pod bound to no node
/// (or bytes that are not a pod).
fn entry_of(stored: &[u8]) -> Option<(String, Vec<Reference>)> {
    let pod: Pod = serde_json::from_slice(stored).ok()?;
    let node = pod.spec.as_ref()?.node_name.clone().filter(|n| !n.is_empty())?;
    let mut refs = PodReferences::default();
    refs.add_pod(&pod);
    Some((node, refs.into_references()))
}

/// Whether a write may have changed what the index holds of a pod: its node or its spec.
/// Status updates, the bulk of a pod's writes, leave the spec's stored text as it was, so
/// they are told apart without decoding the pod.
fn changed(old: Option<&[u8]>, new: Option<&[u8]>) -> bool {
    match (old.and_then(spec_text), new.and_then(spec_text)) {
        (Some(a), Some(b)) => a != b,
        _ => true,
    }
}

/// The text of a stored pod's `spec` (`Some(None)` without one); `None` if the bytes are not
/// an object.
fn spec_text(stored: &[u8]) -> Option<Option<&str>> {
    #[derive(serde::Deserialize)]
    struct Pod<'a> {
        #[serde(borrow)]
        spec: Option<&'a serde_json::value::RawValue>,
    }
    serde_json::from_slice::<Pod>(stored).ok().map(|p| p.spec.map(|s| s.get()))
}

/// Keeps `state.node_references` up to date for as long as the server runs.
pub async fn run(state: Arc<ApiState>) {
    loop {
        if let Err(why) = follow(&state).await {
            tracing::debug!(error = %why, "node reference index restarts");
        }
        state.node_references.lock().ready = false;
        tokio::time::sleep(RETRY).await;
    }
}

/// Reads every pod at one revision, then follows the pods' watch from it; returns when the watch
/// ends or fails.
async fn follow(state: &Arc<ApiState>) -> Result<(), String> {
    let prefix = objects::prefix(&PODS, None);
    let mut fresh = Index::default();
    let mut options = ListOptions { limit: Some(state.store.list_chunk()), ..Default::default() };
    let revision = loop {
        let page = state.store.list(&prefix, &options).await.map_err(|e| e.to_string())?;
        for kv in &page.items {
            fresh.set(&kv.key, entry_of(&kv.value));
        }
        if !page.more {
            break page.revision;
        }
        let last = page.items.last().map(|kv| kv.key.clone()).unwrap_or_default();
        options = ListOptions { revision: Some(page.revision), start_key: Some(objects::key_after(&last)), ..options };
    };
    let Some(mut subscription) = state.watch_hub.subscribe(state, &PODS, revision, Slot::of(&PODS, None, None)).await
    else {
        return Err(format!("no watch of pods from revision {revision}"));
    };
    fresh.ready = true;
    *state.node_references.lock() = fresh;
    let replay = std::mem::take(&mut subscription.replay);
    for (ev, _) in replay {
        apply(state, &ev);
    }
    while let Some(message) = subscription.live.recv().await {
        match message {
            Message::Event(ev, _) => apply(state, &ev),
            Message::End(_) => return Err("the pods' watch ended".into()),
        }
    }
    Err("the pods' watch closed".into())
}

fn apply(state: &ApiState, ev: &Event) {
    let (old, new) = (ev.prev_value.as_deref(), ev.value.as_deref());
    if !changed(old, new) {
        return;
    }
    let entry = new.and_then(entry_of);
    state.node_references.lock().set(&ev.key, entry);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn pod(node: &str, config_map: &str) -> Vec<u8> {
        stored(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "nodeName": node,
                "serviceAccountName": "default",
                "containers": [{"name": "c", "image": "i"}],
                "volumes": [{"name": "v", "configMap": {"name": config_map}}],
            },
        }))
    }

    fn stored(pod: Value) -> Vec<u8> {
        serde_json::to_vec(&pod).unwrap()
    }

    fn index_of(entries: &[(&str, Vec<u8>)]) -> NodeReferences {
        let index = NodeReferences::default();
        {
            let mut inner = index.lock();
            for (key, pod) in entries {
                inner.set(key, entry_of(pod));
            }
            inner.ready = true;
        }
        index
    }

    #[test]
    fn a_node_is_known_to_reference_what_its_pods_name_and_nothing_of_other_nodes() {
        let index = index_of(&[("/p/a", pod("n1", "settings")), ("/p/b", pod("n2", "other"))]);
        assert!(index.references("n1", Referenced::ConfigMap, "ns", "settings"));
        assert!(index.references("n1", Referenced::ServiceAccount, "ns", "default"));
        assert!(!index.references("n1", Referenced::ConfigMap, "ns", "other"));
        assert!(!index.references("n2", Referenced::ConfigMap, "ns", "settings"));
        assert!(!index.references("n1", Referenced::ConfigMap, "elsewhere", "settings"));
    }

    #[test]
    fn a_reference_lasts_while_any_pod_of_the_node_holds_it() {
        let index = index_of(&[("/p/a", pod("n1", "settings")), ("/p/b", pod("n1", "settings"))]);
        index.lock().set("/p/a", None);
        assert!(index.references("n1", Referenced::ConfigMap, "ns", "settings"), "pod b still names it");
        index.lock().set("/p/b", entry_of(&pod("n1", "changed")));
        assert!(!index.references("n1", Referenced::ConfigMap, "ns", "settings"));
        assert!(index.references("n1", Referenced::ConfigMap, "ns", "changed"));
    }

    #[test]
    fn an_index_not_yet_built_knows_nothing() {
        let index = index_of(&[("/p/a", pod("n1", "settings"))]);
        index.lock().ready = false;
        assert!(!index.references("n1", Referenced::ConfigMap, "ns", "settings"));
    }

    #[test]
    fn status_writes_do_not_count_as_changes_but_spec_and_binding_do() {
        let before = pod("n1", "settings");
        let mut status_only: Value = serde_json::from_slice(&before).unwrap();
        status_only["status"] = serde_json::json!({"phase": "Running"});
        let status_only = stored(status_only);
        assert!(!changed(Some(&before), Some(&status_only)));
        assert!(changed(Some(&before), Some(&pod("n2", "settings"))));
        assert!(changed(Some(&before), Some(&pod("n1", "other"))));
        assert!(changed(None, Some(&before)));
        assert!(changed(Some(&before), None));
        assert!(changed(Some(b"not json"), Some(&before)), "what cannot be read counts as changed");
    }
}
