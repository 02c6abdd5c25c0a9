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
//! The shell around `workloads`' pure cores: reflectors of ReplicaSets and pods feed kube's
//! controller runtime (reconcile → `Action`, an error policy with per-object back-off). Pod
//! events are not mapped to their owners with `Controller::owns`: the expectations must see
//! every pod change after the cache has it and before the next sync, and orphans and released
//! pods must wake ReplicaSets that do not (or no longer) own them, so a `Tracker` turns the pod
//! watch into informer-style changes and those into reactions. kube 5's `Controller` builder
//! takes such extra triggers or a shared reflector only behind its unstable features, so the
//! controller drives `applier` (what `Controller::run` runs) with its own trigger streams.

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
use serde_json::json;
use tokio::time::Instant;

use crate::Context;
use crate::workloads::expectations::Expectations;
use crate::workloads::replicas::{self, BURST_REPLICAS};
use crate::workloads::retry::Retry;
use crate::workloads::tracker::{Reaction, Tracker, reactions};
use crate::workloads::{api_message, controller_of, is_not_found, key_of, namespace_terminating, pods};

/// Why a sync of a ReplicaSet failed; it is retried with back-off.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the pod cache stopped")]
    CacheStopped,
    #[error("{action} of replica set {key}")]
    Api {
        action: &'static str,
        key: String,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    fn api(action: &'static str, key: &str, source: kube::Error) -> Error {
        Error::Api { action, key: key.to_string(), source }
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
struct Rsc {
    ctx: Arc<Context>,
    rss: Store<ReplicaSet>,
    pods: Store<Pod>,
    expectations: Arc<Mutex<Expectations>>,
    retry: Retry,
}

/// Runs the ReplicaSet controller until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let (rs_reader, rs_writer) = reflector::store::<ReplicaSet>();
    let (pod_reader, pod_writer) = reflector::store::<Pod>();
    let expectations = Arc::new(Mutex::new(Expectations::default()));
    let (tx, rx) = futures::channel::mpsc::unbounded::<ObjectRef<ReplicaSet>>();

    let forget = expectations.clone();
    let rs_stream = watcher(Api::<ReplicaSet>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(rs_writer)
        .inspect_ok(move |ev| {
            if let watcher::Event::Delete(rs) = ev {
                lock(&forget).forget(&key_of(&rs.metadata));
            }
        })
        .touched_objects();

    let mut tracker = Tracker::default();
    let observer = Observer { rss: rs_reader.clone(), expectations: expectations.clone(), tx };
    let pod_stream = watcher(Api::<Pod>::all(client), watcher::Config::default())
        .default_backoff()
        .modify(pods::slim)
        .reflect(pod_writer)
        .inspect_ok(move |ev| {
            for change in tracker.observe(ev) {
                for r in reactions(&change) {
                    observer.react(r);
                }
            }
        })
        // Pod events reach the queue through the observer's channel; only errors pass here.
        .filter_map(|r| std::future::ready(r.err().map(Err::<ReconcileRequest<ReplicaSet>, _>)));

    let queue = futures::stream::select_all([
        trigger_self(rs_stream, ()).boxed(),
        pod_stream.boxed(),
        rx.map(|r| Ok::<_, watcher::Error>(ReconcileRequest::from(r))).boxed(),
    ]);
    let rsc = Arc::new(Rsc { ctx, rss: rs_reader.clone(), pods: pod_reader, expectations, retry: Retry::default() });
    let results = applier(
        |rs, rsc| CancelableJoinHandle::spawn(reconcile(rs, rsc), &tokio::runtime::Handle::current()),
        error_policy,
        rsc,
        rs_reader,
        queue,
        ControllerConfig::default(),
    );
    crate::log_failures(results, "replicaset").await
}

fn lock(e: &Mutex<Expectations>) -> std::sync::MutexGuard<'_, Expectations> {
    e.lock().unwrap_or_else(|p| p.into_inner())
}

/// Applies the reactions to pod changes: expectations and ReplicaSets to sync.
struct Observer {
    rss: Store<ReplicaSet>,
    expectations: Arc<Mutex<Expectations>>,
    tx: futures::channel::mpsc::UnboundedSender<ObjectRef<ReplicaSet>>,
}

impl Observer {
    /// The ReplicaSet a controller reference names, if it exists with that UID
    /// (`resolveControllerRef`).
    fn resolve(
        &self,
        owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
        namespace: &str,
    ) -> Option<Arc<ReplicaSet>> {
        if owner.kind != "ReplicaSet" || !owner.api_version.starts_with("apps/") {
            return None;
        }
        let rs = self.rss.get(&ObjectRef::new(&owner.name).within(namespace))?;
        (rs.metadata.uid.as_deref() == Some(owner.uid.as_str())).then_some(rs)
    }

    fn enqueue(&self, rs: &ReplicaSet) {
        let _ = self.tx.unbounded_send(ObjectRef::from_obj(rs));
    }

    fn react(&self, r: Reaction) {
        match r {
            Reaction::CreationObserved { owner, namespace } => {
                if let Some(rs) = self.resolve(&owner, &namespace) {
                    lock(&self.expectations).creation_observed(&key_of(&rs.metadata));
                }
            }
            Reaction::DeletionObserved { owner, namespace, child } => {
                if let Some(rs) = self.resolve(&owner, &namespace) {
                    lock(&self.expectations).deletion_observed(&key_of(&rs.metadata), &child);
                }
            }
            Reaction::Enqueue { owner, namespace } => {
                if let Some(rs) = self.resolve(&owner, &namespace) {
                    self.enqueue(&rs);
                }
            }
            Reaction::EnqueueMatching { namespace, labels } => {
                for rs in self.rss.state() {
                    if rs.metadata.namespace.as_deref() != Some(namespace.as_str()) {
                        continue;
                    }
                    let selector = rs.spec.as_ref().and_then(|s| LabelSelector::from_k8s(&s.selector).ok());
                    // An empty selector matches nothing here (validation requires one).
                    if selector.is_some_and(|s| !s.is_empty() && s.matches(&labels)) {
                        self.enqueue(&rs);
                    }
                }
            }
        }
    }
}

async fn reconcile(rs: Arc<ReplicaSet>, rsc: Arc<Rsc>) -> Result<Action, Error> {
    let key = key_of(&rs.metadata);
    let result = rsc.sync(&rs, &key).await;
    if result.is_ok() {
        rsc.retry.succeeded(&key);
    }
    result
}

fn error_policy(rs: Arc<ReplicaSet>, error: &Error, rsc: Arc<Rsc>) -> Action {
    let key = key_of(&rs.metadata);
    let delay = rsc.retry.failed(&key);
    let source = std::error::Error::source(error).map(|s| s.to_string()).unwrap_or_default();
    tracing::info!(replicaset = %key, error = %error, cause = %source, retry_in = ?delay, "replicaset sync failed");
    Action::requeue(delay)
}

impl Rsc {
    async fn sync(&self, rs: &Arc<ReplicaSet>, key: &str) -> Result<Action, Error> {
        self.pods.wait_until_ready().await.map_err(|_| Error::CacheStopped)?;
        let needs_sync = lock(&self.expectations).satisfied(key, Instant::now());
        let now = jiff::Timestamp::now();
        let Some(spec) = rs.spec.as_ref() else { return Ok(Action::await_change()) };
        let selector = match LabelSelector::from_k8s(&spec.selector) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(replicaset = %key, error = %e, "invalid selector; not syncing");
                return Ok(Action::await_change());
            }
        };
        let namespace = rs.metadata.namespace.clone().unwrap_or_default();
        let all_pods = self.pods.state();
        let active: Vec<&Pod> = all_pods
            .iter()
            .map(|p| p.as_ref())
            .filter(|p| p.metadata.namespace.as_deref() == Some(namespace.as_str()) && pods::is_active(p))
            .collect();
        let claim = replicas::claim(rs, &selector, &active);
        let adopted = self.adopt_and_release(rs, key, &claim).await?;
        let mut mine: Vec<&Pod> = claim.owned.clone();
        mine.extend(adopted.iter());

        let failure = if needs_sync && rs.metadata.deletion_timestamp.is_none() {
            self.manage_replicas(rs, key, &mine, &all_pods).await.err()
        } else {
            None
        };
        let status = replicas::status(rs, &mine, failure.as_ref().map(Error::message).as_deref(), now);
        if replicas::status_changed(rs, &status) {
            self.write_status(rs, key, status).await?;
        }
        if let Some(e) = failure {
            return Err(e);
        }
        let recheck = [
            replicas::next_availability_check(rs, &mine, now),
            lock(&self.expectations).expires_in(key, Instant::now()),
        ];
        Ok(match recheck.into_iter().flatten().min() {
            Some(after) => Action::requeue(after),
            None => Action::await_change(),
        })
    }

    /// Adopts matching orphans and releases strays (`claimPods`); returns the adopted pods.
    async fn adopt_and_release(
        &self,
        rs: &ReplicaSet,
        key: &str,
        claim: &replicas::Claim<'_>,
    ) -> Result<Vec<Pod>, Error> {
        let namespace = rs.metadata.namespace.as_deref().unwrap_or("");
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), namespace);
        let rs_uid = rs.metadata.uid.clone().unwrap_or_default();
        let mut adopted = Vec::new();
        let mut first_error = None;
        if !claim.adopt.is_empty() && self.can_adopt(rs, key).await? {
            for pod in &claim.adopt {
                let owner = crate::workloads::controller_ref("apps/v1", "ReplicaSet", &rs.metadata);
                // The pod's UID is a precondition, as kube-controller-manager sends it.
                let patch = json!({"metadata": {"ownerReferences": [owner], "uid": pod.metadata.uid}});
                let name = pod.metadata.name.as_deref().unwrap_or("");
                match api.patch(name, &PatchParams::default(), &Patch::Strategic(&patch)).await {
                    // Adopted unless someone else controls it by now.
                    Ok(p) if controller_of(&p.metadata).is_some_and(|c| c.uid == rs_uid) => adopted.push(p),
                    Ok(_) => {}
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => {
                        first_error.get_or_insert(Error::api("adopting pods", key, e));
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
                    first_error.get_or_insert(Error::api("releasing pods", key, e));
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
    async fn can_adopt(&self, rs: &ReplicaSet, key: &str) -> Result<bool, Error> {
        let api: Api<ReplicaSet> =
            Api::namespaced(self.ctx.client.clone(), rs.metadata.namespace.as_deref().unwrap_or(""));
        let fresh =
            api.get(rs.metadata.name.as_deref().unwrap_or("")).await.map_err(|e| Error::api("reading", key, e))?;
        Ok(fresh.metadata.uid == rs.metadata.uid && fresh.metadata.deletion_timestamp.is_none())
    }

    /// Creates or deletes pods to reach `spec.replicas` (`manageReplicas`).
    async fn manage_replicas(
        &self,
        rs: &Arc<ReplicaSet>,
        key: &str,
        mine: &[&Pod],
        all_pods: &[Arc<Pod>],
    ) -> Result<(), Error> {
        let want = usize::try_from(replicas::replicas(rs)).unwrap_or(0);
        let have = mine.len();
        if have < want {
            let count = (want - have).min(BURST_REPLICAS);
            lock(&self.expectations).expect_creations(key, count, Instant::now());
            let api: Api<Pod> =
                Api::namespaced(self.ctx.client.clone(), rs.metadata.namespace.as_deref().unwrap_or(""));
            let pod = replicas::pod_from_template(rs);
            let (created, error) = replicas::slow_start(count, || self.create_pod(&api, rs, &pod)).await;
            // Creates never attempted or failed will not be observed.
            for _ in created..count {
                lock(&self.expectations).creation_observed(key);
            }
            if let Some(e) = error {
                return Err(Error::api("creating pods", key, e));
            }
        } else if have > want {
            let count = (have - want).min(BURST_REPLICAS);
            let related = self.related_pods(rs, all_pods);
            let related: Vec<&Pod> = related.iter().map(|p| p.as_ref()).collect();
            let victims = pods::pods_to_delete(mine, &related, count);
            let keys = victims.iter().map(|p| key_of(&p.metadata));
            lock(&self.expectations).expect_deletions(key, keys, Instant::now());
            let api: Api<Pod> =
                Api::namespaced(self.ctx.client.clone(), rs.metadata.namespace.as_deref().unwrap_or(""));
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
                return Err(Error::api("deleting pods", key, e));
            }
        }
        Ok(())
    }

    async fn create_pod(&self, api: &Api<Pod>, rs: &Arc<ReplicaSet>, pod: &Pod) -> Result<(), kube::Error> {
        match api.create(&PostParams::default(), pod).await {
            Ok(created) => {
                let name = created.metadata.name.unwrap_or_default();
                tracing::debug!(replicaset = %key_of(&rs.metadata), pod = %name, "created pod");
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

    async fn delete_pod(&self, api: &Api<Pod>, rs: &Arc<ReplicaSet>, pod: &Pod) -> Result<(), kube::Error> {
        let name = pod.metadata.name.as_deref().unwrap_or("");
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::debug!(replicaset = %key_of(&rs.metadata), pod = %name, "deleted pod");
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
    fn related_pods(&self, rs: &ReplicaSet, all_pods: &[Arc<Pod>]) -> Vec<Arc<Pod>> {
        let Some(controller) = controller_of(&rs.metadata) else { return Vec::new() };
        let namespace = rs.metadata.namespace.as_deref();
        let selectors: Vec<LabelSelector> = self
            .rss
            .state()
            .iter()
            .filter(|r| r.metadata.namespace.as_deref() == namespace)
            .filter(|r| controller_of(&r.metadata).is_some_and(|c| c.uid == controller.uid))
            .filter_map(|r| r.spec.as_ref().and_then(|s| LabelSelector::from_k8s(&s.selector).ok()))
            .collect();
        let empty = Default::default();
        all_pods
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
    async fn write_status(&self, rs: &ReplicaSet, key: &str, mut status: ReplicaSetStatus) -> Result<(), Error> {
        // The generation acted on, even if the retry reads a newer one.
        status.observed_generation = rs.metadata.generation;
        let api: Api<ReplicaSet> =
            Api::namespaced(self.ctx.client.clone(), rs.metadata.namespace.as_deref().unwrap_or(""));
        let name = rs.metadata.name.as_deref().unwrap_or("");
        let mut obj = rs.clone();
        obj.status = Some(status.clone());
        if api.replace_status(name, &PostParams::default(), &obj).await.is_ok() {
            return Ok(());
        }
        let mut fresh = api.get(name).await.map_err(|e| Error::api("reading", key, e))?;
        fresh.status = Some(status);
        api.replace_status(name, &PostParams::default(), &fresh)
            .await
            .map_err(|e| Error::api("updating the status", key, e))?;
        Ok(())
    }
}
