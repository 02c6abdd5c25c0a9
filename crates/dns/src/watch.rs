//! Watches on Services and EndpointSlices that keep the index current.
//!
//! Each watch applies events as they come. A (re)list applies every listed object in place, so
//! answers stay whole meanwhile, then drops what the list no longer holds.

use std::collections::HashSet;
use std::fmt::Debug;
use std::pin::pin;
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::records::{Key, Records};

/// Which watches have delivered their first full list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Synced {
    pub services: bool,
    pub slices: bool,
}

impl Synced {
    pub fn all(&self) -> bool {
        self.services && self.slices
    }
}

/// The index and its load state, shared by the watches and the listeners.
#[derive(Debug)]
pub(crate) struct Shared {
    pub records: RwLock<Records>,
    pub synced: watch::Sender<Synced>,
}

/// A kind the index holds.
pub(crate) trait Indexed:
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static
{
    fn apply(records: &mut Records, obj: &Self);
    fn delete(records: &mut Records, ns: &str, name: &str);
    fn retain(records: &mut Records, keep: &HashSet<Key>);
    fn mark(synced: &mut Synced);
}

impl Indexed for Service {
    fn apply(records: &mut Records, obj: &Self) {
        records.apply_service(obj);
    }
    fn delete(records: &mut Records, ns: &str, name: &str) {
        records.delete_service(ns, name);
    }
    fn retain(records: &mut Records, keep: &HashSet<Key>) {
        records.retain_services(keep);
    }
    fn mark(synced: &mut Synced) {
        synced.services = true;
    }
}

impl Indexed for EndpointSlice {
    fn apply(records: &mut Records, obj: &Self) {
        records.apply_slice(obj);
    }
    fn delete(records: &mut Records, ns: &str, name: &str) {
        records.delete_slice(ns, name);
    }
    fn retain(records: &mut Records, keep: &HashSet<Key>) {
        records.retain_slices(keep);
    }
    fn mark(synced: &mut Synced) {
        synced.slices = true;
    }
}

/// Follows one kind in all namespaces for as long as it is polled; errors are retried with
/// the watcher's back-off.
pub(crate) async fn follow<K: Indexed>(client: kube::Client, shared: Arc<Shared>) {
    let api: Api<K> = Api::all(client);
    let mut events = pin!(watcher::watcher(api, watcher::Config::default()).default_backoff());
    let mut listed: Option<HashSet<Key>> = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => listed = Some(HashSet::new()),
            Ok(Event::InitApply(obj)) => {
                if let (Some(seen), Some(key)) = (listed.as_mut(), key_of(&obj)) {
                    seen.insert(key);
                }
                K::apply(&mut write(&shared), &obj);
            }
            Ok(Event::InitDone) => {
                K::retain(&mut write(&shared), &listed.take().unwrap_or_default());
                shared.synced.send_modify(K::mark);
            }
            Ok(Event::Apply(obj)) => K::apply(&mut write(&shared), &obj),
            Ok(Event::Delete(obj)) => {
                if let Some((ns, name)) = key_of(&obj) {
                    K::delete(&mut write(&shared), &ns, &name);
                }
            }
            Err(e) => tracing::warn!(kind = %K::kind(&()), error = %e, "dns watch failed; retrying"),
        }
    }
}

fn key_of<K: Resource>(obj: &K) -> Option<Key> {
    let meta = obj.meta();
    Some((meta.namespace.clone()?, meta.name.clone()?))
}

/// The index for writing; a poisoned lock only means a panic elsewhere mid-update of plain maps.
pub(crate) fn write(shared: &Shared) -> std::sync::RwLockWriteGuard<'_, Records> {
    shared.records.write().unwrap_or_else(|e| e.into_inner())
}

/// The index for reading.
pub(crate) fn read(shared: &Shared) -> std::sync::RwLockReadGuard<'_, Records> {
    shared.records.read().unwrap_or_else(|e| e.into_inner())
}
