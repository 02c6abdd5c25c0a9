//! The ReplicaSet controller: keeps `spec.replicas` pods matching each ReplicaSet's selector,
//! adopting orphans and releasing strays, and reports their counts in its status.
//!
//! It behaves as kube-controller-manager's (`pkg/controller/replicaset`): pods are created from
//! the template with `generateName: <rs>-` in slow-start batches (1, 2, 4, ...; at most
//! `BURST_REPLICAS` (500) per sync), deleted least valuable first, and a ReplicaSet acts on its
//! cache only when the creates and deletes it made before have come back through the watch
//! (expectations); a failed create sets the `ReplicaFailure` condition, cleared by the next
//! sync whose creates and deletes succeed.
//!
//! The shell around `workloads`' pure cores: a reflector of ReplicaSets and the controllers' shared
//! pod cache feed kube's controller runtime (reconcile → `Action`, an error policy with per-object
//! back-off). Pod events are not mapped to their owners with `Controller::owns`: the expectations
//! must see every pod change after the cache has it and before the next sync, and orphans and
//! released pods must wake ReplicaSets that do not (or no longer) own them, so a `Tracker` turns
//! the pod watch into informer-style changes and those into reactions. kube 5's `Controller`
//! builder takes such extra triggers or a shared reflector only behind its unstable features, so
//! the controller drives `applier` (what `Controller::run` runs) with its own trigger streams.
//!
//! The shell is generic over [`Replicated`], the kind it keeps pods for: [`run`] runs it over
//! ReplicaSets, and `replication::run` over ReplicationControllers, as kube-controller-manager
//! runs this controller's code for both.

use std::sync::{Arc, Mutex};

use berth_api::selector::LabelSelector;
use berth_events::{Event, Type};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetStatus};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, ReconcileRequest, applier, trigger_self};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::utils::CancelableJoinHandle;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::Context;
use crate::pod_cache::PodEvent;
use crate::workloads::expectations::Expectations;
use crate::workloads::pacing::Pacing;
use crate::workloads::replicas::{self, BURST_REPLICAS};
use crate::workloads::replicated::Replicated;
use crate::workloads::retry::Retry;
use crate::workloads::tracker::{self, Change, Reaction, Seen, reactions};
use crate::workloads::{api_message, controller_of, is_not_found, key_of, namespace_terminating, pods};

/// Why a sync of a ReplicaSet (or ReplicationController) failed; it is retried with back-off.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the pod cache stopped")]
    CacheStopped,
    #[error("{action} of {noun} {key}")]
    Api {
        action: &'static str,
        /// The kind in words (`replica set`, `replication controller`).
        noun: &'static str,
        key: String,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    fn api<K: Replicated>(action: &'static str, key: &str, source: kube::Error) -> Error {
        Error::Api { action, noun: K::NOUN, key: key.to_string(), source }
    }

    /// What the API said, as Go's `err.Error()` of a status error shows it.
    fn message(&self) -> String {
        match self {
            Error::Api { source, .. } => api_message(source),
            other => other.to_string(),
        }
    }
}

/// The controller's state shared by its reconciles.
struct Rsc<K: Replicated> {
    ctx: Arc<Context>,
    rss: Store<K>,
    pods: Store<Pod>,
    /// True once this controller has been sent every pod of the cache's first list: before
    /// that, the additions still queued for it would count as its own creations.
    pods_synced: tokio::sync::watch::Receiver<bool>,
    expectations: Arc<Mutex<Expectations>>,
    retry: Retry,
    /// Holds back the syncs of large ReplicaSets by what their passes over the pods cost.
    pacing: Arc<Pacing>,
}

/// Runs the ReplicaSet controller until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    run_for::<ReplicaSet>(ctx).await
}

/// Runs the controller over objects of kind `K` until the future is dropped.
pub(crate) async fn run_for<K: Replicated>(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let (rs_reader, rs_writer) = reflector::store::<K>();
    let pod_cache = ctx.pods();
    let expectations = Arc::new(Mutex::new(Expectations::default()));
    let (tx, rx) = futures::channel::mpsc::unbounded::<ObjectRef<K>>();

    let forget = expectations.clone();
    let pacing = Arc::new(Pacing::default());
    let unpace = pacing.clone();
    let rs_stream = watcher(Api::<K>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(rs_writer)
        .inspect_ok(move |ev| {
            if let watcher::Event::Delete(rs) = ev {
                lock(&forget).forget(&key_of(rs.meta()));
                unpace.forget(&key_of(rs.meta()));
            }
        })
        .touched_objects();

    let observer = Observer { rss: rs_reader.clone(), expectations: expectations.clone(), tx };
    let (synced_tx, pods_synced) = tokio::sync::watch::channel(false);
    let pod_stream = pod_cache
        .subscribe()
        .map(move |ev| {
            let changes = match ev {
                PodEvent::Applied { old, new } => tracker::between(old.as_deref(), new.as_ref()),
                PodEvent::Deleted(pod) => vec![Change::Deleted(Seen::of(pod.as_ref()))],
                PodEvent::Synced => {
                    synced_tx.send_replace(true);
                    Vec::new()
                }
            };
            for change in changes {
                for r in reactions(&change) {
                    observer.react(r);
                }
            }
        })
        // Pod events reach the queue through the observer's channel.
        .filter_map(|()| std::future::ready(None::<Result<ReconcileRequest<K>, watcher::Error>>));

    let queue = futures::stream::select_all([
        trigger_self(rs_stream, ()).boxed(),
        pod_stream.boxed(),
        rx.map(|r| Ok::<_, watcher::Error>(ReconcileRequest::from(r))).boxed(),
    ]);
    let rsc = Arc::new(Rsc {
        pods: pod_cache.store(),
        pods_synced,
        ctx,
        rss: rs_reader.clone(),
        expectations,
        retry: Retry::default(),
        pacing,
    });
    let results = applier(
        |rs, rsc| CancelableJoinHandle::spawn(reconcile(rs, rsc), &tokio::runtime::Handle::current()),
        error_policy,
        rsc,
        rs_reader,
        queue,
        ControllerConfig::default(),
    );
    crate::log_failures(results, K::CONTROLLER).await
}

/// The `status` of a ReplicaSet or ReplicationController as its kind writes it.
fn status_json<K: Replicated>(obj: &K) -> Value {
    serde_json::to_value(obj).ok().and_then(|mut v| v.get_mut("status").map(Value::take)).unwrap_or(Value::Null)
}

fn lock(e: &Mutex<Expectations>) -> std::sync::MutexGuard<'_, Expectations> {
    e.lock().unwrap_or_else(|p| p.into_inner())
}

/// Applies the reactions to pod changes: expectations and ReplicaSets to sync.
struct Observer<K: Replicated> {
    rss: Store<K>,
    expectations: Arc<Mutex<Expectations>>,
    tx: futures::channel::mpsc::UnboundedSender<ObjectRef<K>>,
}

impl<K: Replicated> Observer<K> {
    /// The ReplicaSet a controller reference names, if it exists with that UID
    /// (`resolveControllerRef`).
    fn resolve(
        &self,
        owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
        namespace: &str,
    ) -> Option<Arc<K>> {
        if !K::is_kind_of(&owner.api_version, &owner.kind) {
            return None;
        }
        let rs = self.rss.get(&ObjectRef::new(&owner.name).within(namespace))?;
        (rs.meta().uid.as_deref() == Some(owner.uid.as_str())).then_some(rs)
    }

    fn enqueue(&self, rs: &K) {
        let _ = self.tx.unbounded_send(ObjectRef::from_obj(rs));
    }

    fn react(&self, r: Reaction) {
        match r {
            Reaction::CreationObserved { owner, namespace } => {
                if let Some(rs) = self.resolve(&owner, &namespace) {
                    lock(&self.expectations).creation_observed(&key_of(rs.meta()));
                }
            }
            Reaction::DeletionObserved { owner, namespace, child } => {
                if let Some(rs) = self.resolve(&owner, &namespace) {
                    lock(&self.expectations).deletion_observed(&key_of(rs.meta()), &child);
                }
            }
            Reaction::Enqueue { owner, namespace } => {
                if let Some(rs) = self.resolve(&owner, &namespace) {
                    self.enqueue(&rs);
                }
            }
            Reaction::EnqueueMatching { namespace, labels } => {
                for rs in self.rss.state() {
                    if rs.meta().namespace.as_deref() != Some(namespace.as_str()) {
                        continue;
                    }
                    let selector = rs.has_spec().then(|| rs.selector().ok()).flatten();
                    // An empty selector matches nothing here (validation requires one).
                    if selector.is_some_and(|s| !s.is_empty() && s.matches(&labels)) {
                        self.enqueue(&rs);
                    }
                }
            }
        }
    }
}

async fn reconcile<K: Replicated>(rs: Arc<K>, rsc: Arc<Rsc<K>>) -> Result<Action, Error> {
    let key = key_of(rs.meta());
    let result = rsc.sync(&rs, &key).await;
    if result.is_ok() {
        rsc.retry.succeeded(&key);
    }
    result
}

fn error_policy<K: Replicated>(rs: Arc<K>, error: &Error, rsc: Arc<Rsc<K>>) -> Action {
    let key = key_of(rs.meta());
    let delay = rsc.retry.failed(&key);
    let source = std::error::Error::source(error).map(|s| s.to_string()).unwrap_or_default();
    tracing::info!(controller = K::CONTROLLER, object = %key, error = %error, cause = %source, retry_in = ?delay, "sync failed");
    Action::requeue(delay)
}

impl<K: Replicated> Rsc<K> {
    async fn sync(&self, rs: &Arc<K>, key: &str) -> Result<Action, Error> {
        self.pods_synced.clone().wait_for(|synced| *synced).await.map_err(|_| Error::CacheStopped)?;
        let rs = match self.pacing.wait_before(key, std::time::Instant::now()) {
            Some(wait) => {
                tokio::time::sleep(wait).await;
                // What changed while this sync waited is what it acts on.
                match self.rss.get(&ObjectRef::from_obj(&**rs)) {
                    Some(latest) => latest,
                    None => return Ok(Action::await_change()),
                }
            }
            None => rs.clone(),
        };
        let rs = &rs;
        let needs_sync = lock(&self.expectations).satisfied(key, Instant::now());
        let now = jiff::Timestamp::now();
        if !rs.has_spec() {
            return Ok(Action::await_change());
        }
        let selector = match rs.selector() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(controller = K::CONTROLLER, object = %key, error = %e, "invalid selector; not syncing");
                return Ok(Action::await_change());
            }
        };
        let namespace = rs.meta().namespace.clone().unwrap_or_default();
        let pass = std::time::Instant::now();
        // Pods other controllers own are never claimed: its own and the orphans are the ones.
        let candidates = self.ctx.pods().claimable(&namespace, rs.meta().uid.as_deref().unwrap_or_default());
        let active: Vec<&Pod> = candidates.iter().map(|p| p.as_ref()).filter(|p| pods::is_active(p)).collect();
        let claim = replicas::claim(&**rs, &selector, &active);
        let mut pass_cost = pass.elapsed();
        let adopted = self.adopt_and_release(rs, key, &claim).await?;
        let mut mine: Vec<&Pod> = claim.owned.clone();
        mine.extend(adopted.iter());

        let failure = if needs_sync && rs.meta().deletion_timestamp.is_none() {
            self.manage_replicas(rs, key, &mine).await.err()
        } else {
            None
        };
        let pass = std::time::Instant::now();
        let status = replicas::status(&**rs, &mine, failure.as_ref().map(Error::message).as_deref(), now);
        pass_cost += pass.elapsed();
        self.pacing.ended(key, pass_cost, std::time::Instant::now());
        if replicas::status_changed(&**rs, &status) {
            self.write_status(rs, key, status).await?;
        }
        if let Some(e) = failure {
            return Err(e);
        }
        let recheck = [
            replicas::next_availability_check(&**rs, &mine, now),
            lock(&self.expectations).expires_in(key, Instant::now()),
        ];
        Ok(match recheck.into_iter().flatten().min() {
            Some(after) => Action::requeue(after),
            None => Action::await_change(),
        })
    }

    /// Adopts matching orphans and releases strays (`claimPods`); returns the adopted pods.
    async fn adopt_and_release(&self, rs: &K, key: &str, claim: &replicas::Claim<'_>) -> Result<Vec<Pod>, Error> {
        let namespace = rs.meta().namespace.as_deref().unwrap_or("");
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), namespace);
        let rs_uid = rs.meta().uid.clone().unwrap_or_default();
        let mut adopted = Vec::new();
        let mut first_error = None;
        if !claim.adopt.is_empty() && self.can_adopt(rs, key).await? {
            for pod in &claim.adopt {
                let owner = crate::workloads::controller_ref(&K::api_version(&()), &K::kind(&()), rs.meta());
                // The pod's UID is a precondition, as kube-controller-manager sends it.
                let patch = json!({"metadata": {"ownerReferences": [owner], "uid": pod.metadata.uid}});
                let name = pod.metadata.name.as_deref().unwrap_or("");
                match api.patch(name, &PatchParams::default(), &Patch::Strategic(&patch)).await {
                    // Adopted unless someone else controls it by now.
                    Ok(p) if controller_of(&p.metadata).is_some_and(|c| c.uid == rs_uid) => adopted.push(p),
                    Ok(_) => {}
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => {
                        first_error.get_or_insert(Error::api::<K>("adopting pods", key, e));
                    }
                }
            }
        }
        for pod in &claim.release {
            let patch = json!({"metadata": {"ownerReferences": [{"$patch": "delete", "uid": rs_uid}], "uid": pod.metadata.uid}});
            let name = pod.metadata.name.as_deref().unwrap_or("");
            match api.patch(name, &PatchParams::default(), &Patch::Strategic(&patch)).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) || matches!(&e, kube::Error::Api(s) if s.is_invalid()) => {}
                Err(e) => {
                    first_error.get_or_insert(Error::api::<K>("releasing pods", key, e));
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(adopted),
        }
    }

    /// A fresh read of the ReplicaSet confirms it is the same and not being deleted before it
    /// adopts anything (`RecheckDeletionTimestamp`).
    async fn can_adopt(&self, rs: &K, key: &str) -> Result<bool, Error> {
        let api: Api<K> = Api::namespaced(self.ctx.client.clone(), rs.meta().namespace.as_deref().unwrap_or(""));
        let fresh =
            api.get(rs.meta().name.as_deref().unwrap_or("")).await.map_err(|e| Error::api::<K>("reading", key, e))?;
        Ok(fresh.meta().uid == rs.meta().uid && fresh.meta().deletion_timestamp.is_none())
    }

    /// Creates or deletes pods to reach `spec.replicas` (`manageReplicas`).
    async fn manage_replicas(&self, rs: &Arc<K>, key: &str, mine: &[&Pod]) -> Result<(), Error> {
        let want = usize::try_from(rs.replicas()).unwrap_or(0);
        let have = mine.len();
        if have < want {
            let count = (want - have).min(BURST_REPLICAS);
            lock(&self.expectations).expect_creations(key, count, Instant::now());
            let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), rs.meta().namespace.as_deref().unwrap_or(""));
            let pod = replicas::pod_from_template(&**rs);
            let (created, error) = replicas::slow_start(count, || self.create_pod(&api, rs, &pod)).await;
            // Creates never attempted or failed will not be observed.
            for _ in created..count {
                lock(&self.expectations).creation_observed(key);
            }
            if let Some(e) = error {
                return Err(Error::api::<K>("creating pods", key, e));
            }
        } else if have > want {
            let count = (have - want).min(BURST_REPLICAS);
            let related = self.related_pods(rs);
            let related: Vec<&Pod> = related.iter().map(|p| p.as_ref()).collect();
            let victims = pods::pods_to_delete(mine, &related, count);
            let keys = victims.iter().map(|p| key_of(&p.metadata));
            lock(&self.expectations).expect_deletions(key, keys, Instant::now());
            let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), rs.meta().namespace.as_deref().unwrap_or(""));
            let results = futures::future::join_all(victims.iter().map(|p| self.delete_pod(&api, rs, p))).await;
            let mut first_error = None;
            for (pod, result) in victims.iter().zip(results) {
                if let Err(e) = result {
                    // The deletion will not be observed.
                    lock(&self.expectations).deletion_observed(key, &key_of(&pod.metadata));
                    if !is_not_found(&e) {
                        first_error.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = first_error {
                return Err(Error::api::<K>("deleting pods", key, e));
            }
        }
        Ok(())
    }

    async fn create_pod(&self, api: &Api<Pod>, rs: &Arc<K>, pod: &Pod) -> Result<(), kube::Error> {
        match api.create(&PostParams::default(), pod).await {
            Ok(created) => {
                let name = created.metadata.name.unwrap_or_default();
                tracing::debug!(controller = K::CONTROLLER, object = %key_of(rs.meta()), pod = %name, "created pod");
                self.ctx.recorder.emit(Event::about(
                    rs.as_ref(),
                    Type::Normal,
                    "SuccessfulCreate",
                    format!("Created pod: {name}"),
                ));
                Ok(())
            }
            Err(e) => {
                self.ctx.recorder.emit(Event::about(
                    rs.as_ref(),
                    Type::Warning,
                    "FailedCreate",
                    format!("Error creating: {}", api_message(&e)),
                ));
                // Nothing can be created in a namespace being deleted; that is no failure.
                if namespace_terminating(&e) { Ok(()) } else { Err(e) }
            }
        }
    }

    async fn delete_pod(&self, api: &Api<Pod>, rs: &Arc<K>, pod: &Pod) -> Result<(), kube::Error> {
        let name = pod.metadata.name.as_deref().unwrap_or("");
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::debug!(controller = K::CONTROLLER, object = %key_of(rs.meta()), pod = %name, "deleted pod");
                self.ctx.recorder.emit(Event::about(
                    rs.as_ref(),
                    Type::Normal,
                    "SuccessfulDelete",
                    format!("Deleted pod: {name}"),
                ));
                Ok(())
            }
            Err(e) if is_not_found(&e) => Err(e),
            Err(e) => {
                self.ctx.recorder.emit(Event::about(
                    rs.as_ref(),
                    Type::Warning,
                    "FailedDelete",
                    format!("Error deleting: {}", api_message(&e)),
                ));
                Err(e)
            }
        }
    }

    /// The pods of every ReplicaSet with the same controller (a Deployment's other revisions),
    /// used to prefer deleting pods doubled up on a node (`getIndirectlyRelatedPods`).
    fn related_pods(&self, rs: &K) -> Vec<Arc<Pod>> {
        let Some(controller) = controller_of(rs.meta()) else { return Vec::new() };
        let namespace = rs.meta().namespace.as_deref();
        let selectors: Vec<LabelSelector> = self
            .rss
            .state()
            .iter()
            .filter(|r| r.meta().namespace.as_deref() == namespace)
            .filter(|r| controller_of(r.meta()).is_some_and(|c| c.uid == controller.uid))
            .filter_map(|r| r.has_spec().then(|| r.selector().ok()).flatten())
            .collect();
        let empty = Default::default();
        self.pods
            .state()
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == namespace)
            .filter(|p| {
                let labels = p.metadata.labels.as_ref().unwrap_or(&empty);
                selectors.iter().any(|s| s.matches(labels))
            })
            .cloned()
            .collect()
    }

    /// Writes the status through the status subresource; after a failure, once more over a
    /// fresh read (`updateReplicaSetStatus`).
    /// Writes the status with a merge patch: one request, and no conflict with the spec and
    /// metadata writes of the Deployment controller, which change a ReplicaSet being scaled
    /// several times a second (an update with the cached resourceVersion, retried once after a
    /// read, lost that race under load, and each loss delayed the next sync further).
    async fn write_status(&self, rs: &K, key: &str, mut status: ReplicaSetStatus) -> Result<(), Error> {
        // The generation acted on, even if a newer one is stored by now.
        status.observed_generation = rs.meta().generation;
        let api: Api<K> = Api::namespaced(self.ctx.client.clone(), rs.meta().namespace.as_deref().unwrap_or(""));
        let name = rs.meta().name.as_deref().unwrap_or("");
        let mut obj = rs.clone();
        obj.set_replica_status(status);
        let mut written = status_json(&obj);
        // A merge patch keeps what it does not name: a field the status no longer has is named,
        // as null.
        if let (Value::Object(old), Value::Object(new)) = (status_json(rs), &mut written) {
            for field in old.keys() {
                if !new.contains_key(field) {
                    new.insert(field.clone(), Value::Null);
                }
            }
        }
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(json!({"status": written})))
            .await
            .map_err(|e| Error::api::<K>("updating the status", key, e))?;
        Ok(())
    }
}
