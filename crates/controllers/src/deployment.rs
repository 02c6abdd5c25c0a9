//! The Deployment controller: rolls each Deployment's pod template out through ReplicaSets
//! (RollingUpdate within `maxSurge`/`maxUnavailable`, or Recreate), scales them, keeps their
//! revisions and history, and reports progress in the Deployment's status.
//!
//! It behaves as kube-controller-manager's (`pkg/controller/deployment`), step for step: adopt or
//! release ReplicaSets by selector; note pausing and resuming; when paused or when the Deployment
//! was resized, only scale (proportionally during a rollout); otherwise find or create the new
//! ReplicaSet (`<deployment>-<pod-template-hash>`, found by template equality ignoring the hash,
//! so a rollback re-uses the old ReplicaSet and raises its revision), scale it up and the old
//! ones down, clean up history beyond `revisionHistoryLimit`, and write the status. Every write
//! of a ReplicaSet carries the resourceVersion it was decided on, so a decision made on a stale
//! cache fails with a conflict and is made again.
//!
//! Differences from Kubernetes, all from the API server: berth's status subresource keeps only
//! `status`, so the Deployment's own `deployment.kubernetes.io/revision` annotation is written
//! through the main resource, which (as in Kubernetes for any annotation change there) moves the
//! Deployment's generation; the next sync observes it.

use std::collections::HashMap;
use std::sync::Arc;

use berth_api::selector::LabelSelector;
use berth_events::{Event, Type};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, ReconcileRequest, applier, trigger_self};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::utils::CancelableJoinHandle;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::Context;
use crate::pod_cache::PodEvent;
use crate::workloads::progress::{self, FAILED_RS_CREATE, FOUND_NEW_RS, NEW_RS_CREATED, PROGRESSING};
use crate::workloads::retry::Retry;
use crate::workloads::revision::{self, REVISION};
use crate::workloads::rollout::{self, RECREATE, Scaling};
use crate::workloads::tracker::{Reaction, Tracker, reactions};
use crate::workloads::{
    POD_TEMPLATE_HASH_LABEL, api_message, controller_of, controller_ref, is_already_exists, is_conflict, is_not_found,
    key_of, namespace_terminating, semantically_equal,
};

/// Why a sync of a Deployment failed; it is retried with back-off.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the replica set cache stopped")]
    CacheStopped,
    #[error("{action} for deployment {key}")]
    Api {
        action: &'static str,
        key: String,
        #[source]
        source: kube::Error,
    },
    #[error("replica set {name} of deployment {key} has another template; collisionCount raised")]
    HashCollision { key: String, name: String },
}

impl Error {
    fn api(action: &'static str, key: &str, source: kube::Error) -> Error {
        Error::Api { action, key: key.to_string(), source }
    }

    fn is_conflict(&self) -> bool {
        matches!(self, Error::Api { source, .. } if is_conflict(source))
    }
}

/// The controller's state shared by its reconciles.
struct Dc {
    ctx: Arc<Context>,
    rss: Store<ReplicaSet>,
    pods: Store<Pod>,
    retry: Retry,
}

/// Runs the Deployment controller until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let (d_reader, d_writer) = reflector::store::<Deployment>();
    let (rs_reader, rs_writer) = reflector::store::<ReplicaSet>();
    let pod_cache = ctx.pods();
    let (tx, rx) = futures::channel::mpsc::unbounded::<ObjectRef<Deployment>>();

    let d_stream = watcher(Api::<Deployment>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(d_writer)
        .touched_objects();

    let mut tracker = Tracker::default();
    let rs_observer = Observer { deployments: d_reader.clone(), rss: rs_reader.clone(), tx: tx.clone() };
    let rs_stream = watcher(Api::<ReplicaSet>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(rs_writer)
        .inspect_ok(move |ev| {
            for change in tracker.observe(ev) {
                for r in reactions(&change) {
                    rs_observer.react(r);
                }
            }
        })
        .filter_map(|r| std::future::ready(r.err().map(Err::<ReconcileRequest<Deployment>, _>)));

    // Pods matter only to Recreate, which waits for the old ones to be gone; every pod of a
    // Deployment carries the hash label.
    let pod_observer = Observer { deployments: d_reader.clone(), rss: rs_reader.clone(), tx };
    let pod_stream = pod_cache
        .subscribe()
        .map(move |ev| {
            // Only pods with the label count: one that lost it is gone.
            let pod = match ev {
                PodEvent::Applied { new, .. } if has_hash_label(&new) => Some(new),
                PodEvent::Applied { old: Some(old), .. } if has_hash_label(&old) => Some(old),
                PodEvent::Applied { .. } => None,
                PodEvent::Deleted(pod) => Some(pod).filter(|p| has_hash_label(p)),
                PodEvent::Synced => None,
            };
            if let Some(pod) = pod {
                pod_observer.pod_changed(&pod);
            }
        })
        .filter_map(|()| std::future::ready(None::<Result<ReconcileRequest<Deployment>, watcher::Error>>));

    let queue = futures::stream::select_all([
        trigger_self(d_stream, ()).boxed(),
        rs_stream.boxed(),
        pod_stream.boxed(),
        rx.map(|r| Ok::<_, watcher::Error>(ReconcileRequest::from(r))).boxed(),
    ]);
    let dc = Arc::new(Dc { pods: pod_cache.store(), ctx, rss: rs_reader, retry: Retry::default() });
    let results = applier(
        |d, dc| CancelableJoinHandle::spawn(reconcile(d, dc), &tokio::runtime::Handle::current()),
        error_policy,
        dc,
        d_reader,
        queue,
        ControllerConfig::default(),
    );
    crate::log_failures(results, "deployment").await
}

/// Whether the pod is one a Deployment's ReplicaSet made; the controller looks at no others.
fn has_hash_label(pod: &Pod) -> bool {
    pod.metadata.labels.as_ref().is_some_and(|l| l.contains_key(POD_TEMPLATE_HASH_LABEL))
}

/// Turns changes of ReplicaSets and pods into Deployments to sync.
struct Observer {
    deployments: Store<Deployment>,
    rss: Store<ReplicaSet>,
    tx: futures::channel::mpsc::UnboundedSender<ObjectRef<Deployment>>,
}

impl Observer {
    fn resolve(&self, owner: &OwnerReference, namespace: &str) -> Option<Arc<Deployment>> {
        if owner.kind != "Deployment" || !owner.api_version.starts_with("apps/") {
            return None;
        }
        let d = self.deployments.get(&ObjectRef::new(&owner.name).within(namespace))?;
        (d.metadata.uid.as_deref() == Some(owner.uid.as_str())).then_some(d)
    }

    fn enqueue(&self, d: &Deployment) {
        let _ = self.tx.unbounded_send(ObjectRef::from_obj(d));
    }

    /// The Deployment handlers of ReplicaSet changes (`addReplicaSet`, `updateReplicaSet`,
    /// `deleteReplicaSet`): the controller, or for orphans every Deployment that matches.
    fn react(&self, r: Reaction) {
        match r {
            Reaction::CreationObserved { .. } | Reaction::DeletionObserved { .. } => {}
            Reaction::Enqueue { owner, namespace } => {
                if let Some(d) = self.resolve(&owner, &namespace) {
                    self.enqueue(&d);
                }
            }
            Reaction::EnqueueMatching { namespace, labels } => {
                for d in self.deployments.state() {
                    if d.metadata.namespace.as_deref() != Some(namespace.as_str()) {
                        continue;
                    }
                    let selector = d.spec.as_ref().and_then(|s| LabelSelector::from_k8s(&s.selector).ok());
                    if selector.is_some_and(|s| !s.is_empty() && s.matches(&labels)) {
                        self.enqueue(&d);
                    }
                }
            }
        }
    }

    /// A pod of a Recreate Deployment changed: it may be waiting for the old pods to go.
    fn pod_changed(&self, pod: &Pod) {
        let Some(rs_ref) = controller_of(&pod.metadata) else { return };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("");
        let Some(rs) = self.rss.get(&ObjectRef::new(&rs_ref.name).within(namespace)) else { return };
        let Some(d_ref) = controller_of(&rs.metadata) else { return };
        if let Some(d) = self.resolve(d_ref, namespace)
            && rollout::strategy(&d) == RECREATE
        {
            self.enqueue(&d);
        }
    }
}

async fn reconcile(d: Arc<Deployment>, dc: Arc<Dc>) -> Result<Action, Error> {
    let key = key_of(&d.metadata);
    dc.rss.wait_until_ready().await.map_err(|_| Error::CacheStopped)?;
    dc.pods.wait_until_ready().await.map_err(|_| Error::CacheStopped)?;
    let sync = Sync::new(&dc, &d, key.clone());
    let result = sync.run().await;
    if result.is_ok() {
        dc.retry.succeeded(&key);
    }
    result
}

fn error_policy(d: Arc<Deployment>, error: &Error, dc: Arc<Dc>) -> Action {
    let key = key_of(&d.metadata);
    let delay = dc.retry.failed(&key);
    let source = std::error::Error::source(error).map(|s| s.to_string()).unwrap_or_default();
    if error.is_conflict() {
        tracing::debug!(deployment = %key, error = %error, retry_in = ?delay, "deployment changed meanwhile; syncing again");
    } else {
        tracing::info!(deployment = %key, error = %error, cause = %source, retry_in = ?delay, "deployment sync failed");
    }
    Action::requeue(delay)
}

/// The new ReplicaSet (if any) and the old ones, kept current as the sync writes them.
#[derive(Debug, Default)]
struct Family {
    new: Option<ReplicaSet>,
    old: Vec<ReplicaSet>,
}

impl Family {
    /// Old then new, as the upstream controller appends them.
    fn all(&self) -> Vec<&ReplicaSet> {
        self.old.iter().chain(self.new.as_ref()).collect()
    }

    fn old(&self) -> Vec<&ReplicaSet> {
        self.old.iter().collect()
    }

    fn named(&self, name: &str) -> Option<&ReplicaSet> {
        self.all().into_iter().find(|rs| rs.metadata.name.as_deref() == Some(name))
    }

    fn replace(&mut self, rs: ReplicaSet) {
        if let Some(new) = self.new.as_mut().filter(|n| n.metadata.uid == rs.metadata.uid) {
            *new = rs;
        } else if let Some(old) = self.old.iter_mut().find(|o| o.metadata.uid == rs.metadata.uid) {
            *old = rs;
        }
    }
}

/// One sync of one Deployment (`syncDeployment`), with its working copy.
struct Sync<'a> {
    dc: &'a Dc,
    key: String,
    d: Deployment,
    now: jiff::Timestamp,
    deployments: Api<Deployment>,
    rs_api: Api<ReplicaSet>,
}

impl<'a> Sync<'a> {
    fn new(dc: &'a Dc, d: &Deployment, key: String) -> Sync<'a> {
        let namespace = d.metadata.namespace.as_deref().unwrap_or("");
        Sync {
            dc,
            key,
            d: d.clone(),
            now: jiff::Timestamp::now(),
            deployments: Api::namespaced(dc.ctx.client.clone(), namespace),
            rs_api: Api::namespaced(dc.ctx.client.clone(), namespace),
        }
    }

    fn name(&self) -> &str {
        self.d.metadata.name.as_deref().unwrap_or("")
    }

    fn event(&self, type_: Type, reason: &str, message: String) {
        self.dc.ctx.recorder.emit(Event::about(&self.d, type_, reason, message));
    }

    fn status(&self) -> DeploymentStatus {
        self.d.status.clone().unwrap_or_default()
    }

    async fn run(mut self) -> Result<Action, Error> {
        let Some(spec) = self.d.spec.clone() else { return Ok(Action::await_change()) };
        let selector = match LabelSelector::from_k8s(&spec.selector) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(deployment = %self.key, error = %e, "invalid selector; not syncing");
                return Ok(Action::await_change());
            }
        };
        if selector.is_empty() {
            self.event(
                Type::Warning,
                "SelectingAll",
                "This deployment is selecting all pods. A non-empty selector is required.".into(),
            );
            let generation = self.d.metadata.generation;
            if self.status().observed_generation < generation {
                let mut status = self.status();
                status.observed_generation = generation;
                self.write_status(status).await?;
            }
            return Ok(Action::await_change());
        }
        let mut rs_list = self.claim_replica_sets(&selector).await?;
        if self.d.metadata.deletion_timestamp.is_some() {
            let fam = self.family(&mut rs_list, false).await?;
            return self.sync_status(&fam).await;
        }
        if let Some(status) = progress::paused_status(&self.d, self.now) {
            self.write_status(status).await?;
        }
        if spec.paused == Some(true) {
            return self.sync(&mut rs_list).await;
        }
        // `isScalingEvent` syncs the new ReplicaSet's annotations as a side effect.
        let fam = self.family(&mut rs_list, false).await?;
        if rollout::is_scaling_event(&self.d, fam.all()) {
            return self.sync(&mut rs_list).await;
        }
        if rollout::strategy(&self.d) == RECREATE {
            self.rollout_recreate(&mut rs_list).await
        } else {
            self.rollout_rolling(&mut rs_list).await
        }
    }

    /// The Deployment's ReplicaSets: those it controls that still match, and orphans that
    /// match, adopted (`ClaimReplicaSets`); controlled ones that no longer match are released.
    async fn claim_replica_sets(&self, selector: &LabelSelector) -> Result<Vec<ReplicaSet>, Error> {
        let uid = self.d.metadata.uid.clone().unwrap_or_default();
        let deleting = self.d.metadata.deletion_timestamp.is_some();
        let namespace = self.d.metadata.namespace.clone();
        let empty = Default::default();
        let mut mine = Vec::new();
        let mut can_adopt: Option<bool> = None;
        for rs in self.dc.rss.state() {
            if rs.metadata.namespace != namespace {
                continue;
            }
            let matches = selector.matches(rs.metadata.labels.as_ref().unwrap_or(&empty));
            let name = rs.metadata.name.clone().unwrap_or_default();
            match controller_of(&rs.metadata) {
                Some(c) if c.uid == uid => {
                    if matches {
                        mine.push((*rs).clone());
                    } else if !deleting {
                        let patch = json!({"metadata": {"ownerReferences": [{"$patch": "delete", "uid": uid}], "uid": rs.metadata.uid}});
                        match self.rs_api.patch(&name, &PatchParams::default(), &Patch::Strategic(&patch)).await {
                            Ok(_) => {}
                            Err(e) if is_not_found(&e) => {}
                            Err(e) => return Err(Error::api("releasing replica sets", &self.key, e)),
                        }
                    }
                }
                Some(_) => {}
                None => {
                    if !matches || deleting || rs.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    let allowed = match can_adopt {
                        Some(a) => a,
                        None => {
                            // A fresh read: the Deployment must still be this one and not going.
                            let fresh = self
                                .deployments
                                .get(self.name())
                                .await
                                .map_err(|e| Error::api("reading the deployment", &self.key, e))?;
                            let a = fresh.metadata.uid.as_deref() == Some(uid.as_str())
                                && fresh.metadata.deletion_timestamp.is_none();
                            can_adopt = Some(a);
                            a
                        }
                    };
                    if !allowed {
                        continue;
                    }
                    let owner = controller_ref("apps/v1", "Deployment", &self.d.metadata);
                    let patch = json!({"metadata": {"ownerReferences": [owner], "uid": rs.metadata.uid}});
                    match self.rs_api.patch(&name, &PatchParams::default(), &Patch::Strategic(&patch)).await {
                        Ok(adopted) if controller_of(&adopted.metadata).is_some_and(|c| c.uid == uid) => {
                            mine.push(adopted)
                        }
                        Ok(_) => {}
                        Err(e) if is_not_found(&e) => {}
                        Err(e) => return Err(Error::api("adopting replica sets", &self.key, e)),
                    }
                }
            }
        }
        Ok(mine)
    }

    /// The new and old ReplicaSets, the new one's revision and annotations brought up to date,
    /// created when asked and missing (`getAllReplicaSetsAndSyncRevision`). A ReplicaSet written
    /// here replaces its copy in `rs_list`, so that a later call does not write it again over a
    /// stale resourceVersion.
    async fn family(&mut self, rs_list: &mut [ReplicaSet], create: bool) -> Result<Family, Error> {
        let existing = rollout::find_new_replica_set(&self.d, rs_list).cloned();
        let old: Vec<ReplicaSet> = rollout::old_replica_sets(rs_list, existing.as_ref()).into_iter().cloned().collect();
        let new = self.new_replica_set(existing, &old, create).await?;
        if let Some(new) = &new
            && let Some(listed) = rs_list.iter_mut().find(|rs| rs.metadata.uid == new.metadata.uid)
        {
            *listed = new.clone();
        }
        Ok(Family { new, old })
    }

    /// `getNewReplicaSet`.
    async fn new_replica_set(
        &mut self,
        existing: Option<ReplicaSet>,
        old: &[ReplicaSet],
        create: bool,
    ) -> Result<Option<ReplicaSet>, Error> {
        let new_revision = revision::max_revision(old) + 1;
        let max_surge = rollout::max_surge(&self.d);
        let min_ready = self.d.spec.as_ref().and_then(|s| s.min_ready_seconds).filter(|m| *m != 0);
        if let Some(mut rs) = existing {
            let annotations_changed =
                revision::set_new_replica_set_annotations(&self.d, &mut rs, new_revision, true, max_surge);
            let spec = rs.spec.get_or_insert_with(Default::default);
            if annotations_changed || spec.min_ready_seconds.filter(|m| *m != 0) != min_ready {
                spec.min_ready_seconds = min_ready;
                return self.update_rs(&rs).await.map(Some);
            }
            let rs_revision = rs.metadata.annotations.as_ref().and_then(|a| a.get(REVISION)).cloned();
            if let Some(r) = rs_revision {
                self.set_deployment_revision(&r).await?;
            }
            if progress::has_progress_deadline(&self.d) && progress::condition(&self.status(), PROGRESSING).is_none() {
                let mut status = self.status();
                let msg = format!("Found new replica set {:?}", rs.metadata.name.as_deref().unwrap_or(""));
                progress::set_condition(
                    &mut status,
                    progress::new_condition(PROGRESSING, "True", FOUND_NEW_RS, msg, self.now),
                );
                self.write_status(status).await?;
            }
            return Ok(Some(rs));
        }
        if !create {
            return Ok(None);
        }

        let Some(spec) = self.d.spec.clone() else { return Ok(None) };
        let hash = revision::pod_template_hash(&spec.template, self.status().collision_count);
        let mut template = spec.template.clone();
        let template_meta = template.metadata.get_or_insert_with(Default::default);
        template_meta.labels.get_or_insert_with(Default::default).insert(POD_TEMPLATE_HASH_LABEL.into(), hash.clone());
        let labels = template_meta.labels.clone();
        let mut selector = spec.selector.clone();
        selector.match_labels.get_or_insert_with(Default::default).insert(POD_TEMPLATE_HASH_LABEL.into(), hash.clone());
        let name = format!("{}-{hash}", self.name());
        let mut new_rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: self.d.metadata.namespace.clone(),
                owner_references: Some(vec![controller_ref("apps/v1", "Deployment", &self.d.metadata)]),
                labels,
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(0),
                min_ready_seconds: min_ready,
                selector,
                template: Some(template),
            }),
            status: None,
        };
        let all: Vec<&ReplicaSet> = old.iter().chain([&new_rs]).collect();
        let replicas = rollout::new_rs_new_replicas(&self.d, &all, &new_rs);
        if let Some(s) = new_rs.spec.as_mut() {
            s.replicas = Some(replicas);
        }
        revision::set_new_replica_set_annotations(&self.d, &mut new_rs, new_revision, false, max_surge);

        let (created, already_existed) = match self.rs_api.create(&PostParams::default(), &new_rs).await {
            Ok(created) => (created, false),
            Err(e) if is_already_exists(&e) => {
                // A slow cache, or a hash collision with a ReplicaSet of another template.
                let found = self
                    .rs_api
                    .get(&name)
                    .await
                    .map_err(|e| Error::api("reading the new replica set", &self.key, e))?;
                let ours = controller_of(&found.metadata).is_some_and(|c| Some(&c.uid) == self.d.metadata.uid.as_ref());
                let same = found
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.as_ref())
                    .is_some_and(|t| revision::equal_ignore_hash(t, &spec.template));
                if !(ours && same) {
                    let mut status = self.status();
                    status.collision_count = Some(status.collision_count.unwrap_or(0) + 1);
                    self.write_status(status).await?;
                    return Err(Error::HashCollision { key: self.key.clone(), name });
                }
                (found, true)
            }
            Err(e) if namespace_terminating(&e) => {
                return Err(Error::api("creating the new replica set", &self.key, e));
            }
            Err(e) => {
                let msg = format!("Failed to create new replica set {name:?}: {}", api_message(&e));
                if progress::has_progress_deadline(&self.d) {
                    let mut status = self.status();
                    let c = progress::new_condition(PROGRESSING, "False", FAILED_RS_CREATE, msg.clone(), self.now);
                    progress::set_condition(&mut status, c);
                    // The failure to report matters more than this write's.
                    let _ = self.write_status(status).await;
                }
                self.event(Type::Warning, FAILED_RS_CREATE, msg);
                return Err(Error::api("creating the new replica set", &self.key, e));
            }
        };
        if !already_existed && replicas > 0 {
            self.event(Type::Normal, "ScalingReplicaSet", format!("Scaled up replica set {name} from 0 to {replicas}"));
        }
        self.set_deployment_revision(&new_revision.to_string()).await?;
        if !already_existed && progress::has_progress_deadline(&self.d) {
            let mut status = self.status();
            let msg = format!("Created new replica set {name:?}");
            progress::set_condition(
                &mut status,
                progress::new_condition(PROGRESSING, "True", NEW_RS_CREATED, msg, self.now),
            );
            self.write_status(status).await?;
        }
        Ok(Some(created))
    }

    /// Records the new ReplicaSet's revision on the Deployment (`SetDeploymentRevision`).
    async fn set_deployment_revision(&mut self, revision: &str) -> Result<(), Error> {
        if self.d.metadata.annotations.as_ref().and_then(|a| a.get(REVISION)).map(String::as_str) == Some(revision) {
            return Ok(());
        }
        let patch = json!({"metadata": {
            "resourceVersion": self.d.metadata.resource_version,
            "annotations": {REVISION: revision},
        }});
        let name = self.name().to_string();
        self.d = self
            .deployments
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::api("recording the revision", &self.key, e))?;
        Ok(())
    }

    /// Writes the status through the status subresource, over the resourceVersion it was
    /// computed from.
    async fn write_status(&mut self, status: DeploymentStatus) -> Result<(), Error> {
        let mut obj = self.d.clone();
        obj.status = Some(status);
        let name = self.name().to_string();
        self.d = self
            .deployments
            .replace_status(&name, &PostParams::default(), &obj)
            .await
            .map_err(|e| Error::api("updating the status", &self.key, e))?;
        Ok(())
    }

    /// Writes a ReplicaSet over the resourceVersion it was read at.
    async fn update_rs(&self, rs: &ReplicaSet) -> Result<ReplicaSet, Error> {
        let name = rs.metadata.name.as_deref().unwrap_or("");
        self.rs_api
            .replace(name, &PostParams::default(), rs)
            .await
            .map_err(|e| Error::api("updating a replica set", &self.key, e))
    }

    /// Scales a ReplicaSet and records the Deployment's size on it, reporting a change of size
    /// (`scaleReplicaSet`); returns whether the size changed and the ReplicaSet as written.
    async fn scale_replica_set(&self, rs: &ReplicaSet, to: i32, operation: &str) -> Result<(bool, ReplicaSet), Error> {
        let from = rollout::rs_replicas(rs);
        let desired = rollout::replicas(&self.d);
        let max = desired + rollout::max_surge(&self.d);
        if from == to && !revision::replicas_annotations_need_update(rs, desired, max) {
            return Ok((false, rs.clone()));
        }
        let mut copy = rs.clone();
        copy.spec.get_or_insert_with(Default::default).replicas = Some(to);
        revision::set_replicas_annotations(&mut copy, desired, max);
        let written = self.update_rs(&copy).await?;
        if from != to {
            let name = rs.metadata.name.as_deref().unwrap_or("");
            self.event(
                Type::Normal,
                "ScalingReplicaSet",
                format!("Scaled {operation} replica set {name} from {from} to {to}"),
            );
        }
        Ok((from != to, written))
    }

    /// Scales a ReplicaSet unless it already has that size (`scaleReplicaSetAndRecordEvent`).
    async fn scale_to(&self, rs: &ReplicaSet, to: i32) -> Result<(bool, ReplicaSet), Error> {
        let from = rollout::rs_replicas(rs);
        if from == to {
            return Ok((false, rs.clone()));
        }
        self.scale_replica_set(rs, to, if from < to { "up" } else { "down" }).await
    }

    /// Scaling and pausing (`sync`): scale, clean up history when paused, write the status.
    async fn sync(&mut self, rs_list: &mut [ReplicaSet]) -> Result<Action, Error> {
        let mut fam = self.family(rs_list, false).await?;
        match rollout::scale(&self.d, fam.new.as_ref(), &fam.old()) {
            Scaling::To(steps) => {
                for step in steps {
                    let Some(rs) = fam.named(&step.name).cloned() else { continue };
                    let (_, written) = self.scale_to(&rs, step.replicas).await?;
                    fam.replace(written);
                }
            }
            Scaling::Proportional(steps, operation) => {
                for step in steps {
                    let Some(rs) = fam.named(&step.name).cloned() else { continue };
                    let (_, written) = self.scale_replica_set(&rs, step.replicas, operation).await?;
                    fam.replace(written);
                }
            }
        }
        if self.d.spec.as_ref().and_then(|s| s.paused) == Some(true) {
            self.clean_up(&fam).await?;
        }
        self.sync_status(&fam).await
    }

    /// `rolloutRolling`.
    async fn rollout_rolling(&mut self, rs_list: &mut [ReplicaSet]) -> Result<Action, Error> {
        let mut fam = self.family(rs_list, true).await?;
        let Some(new) = fam.new.clone() else { return self.sync_rollout_status(&fam).await };
        if let Some(to) = rollout::reconcile_new_replica_set(&self.d, &fam.all(), &new) {
            let (scaled, written) = self.scale_to(&new, to).await?;
            fam.replace(written);
            if scaled {
                return self.sync_rollout_status(&fam).await;
            }
        }
        let new = fam.new.clone().unwrap_or(new);
        let steps = rollout::old_scale_downs(&self.d, &rollout::active(fam.old.iter()), &new);
        let mut scaled_down = false;
        for step in steps {
            let Some(rs) = fam.named(&step.name).cloned() else { continue };
            match self.scale_to(&rs, step.replicas).await {
                Ok((scaled, written)) => {
                    scaled_down |= scaled;
                    fam.replace(written);
                }
                // As upstream: a failed scale-down ends the step; the status is still synced.
                Err(e) => {
                    tracing::debug!(deployment = %self.key, error = %e, "scaling down an old replica set failed");
                    break;
                }
            }
        }
        if scaled_down {
            return self.sync_rollout_status(&fam).await;
        }
        if progress::deployment_complete(&self.d, &self.status()) {
            self.clean_up(&fam).await?;
        }
        self.sync_rollout_status(&fam).await
    }

    /// `rolloutRecreate`: old ReplicaSets to zero, wait for their pods to go, then the new one
    /// (created only then) to full size.
    async fn rollout_recreate(&mut self, rs_list: &mut [ReplicaSet]) -> Result<Action, Error> {
        let mut fam = self.family(rs_list, false).await?;
        let mut scaled_down = false;
        for step in rollout::recreate_scale_downs(&fam.old()) {
            let Some(rs) = fam.named(&step.name).cloned() else { continue };
            let (scaled, written) = self.scale_to(&rs, 0).await?;
            scaled_down |= scaled;
            fam.replace(written);
        }
        if scaled_down {
            return self.sync_rollout_status(&fam).await;
        }
        let owned: Vec<(&str, Vec<Arc<Pod>>)> = rs_list
            .iter()
            .filter_map(|rs| rs.metadata.uid.as_deref())
            .map(|uid| (uid, self.dc.ctx.pods().of_controller(uid)))
            .collect();
        let mut by_rs: HashMap<String, Vec<&Pod>> = HashMap::new();
        for (uid, pods) in &owned {
            for pod in pods.iter().filter(|p| has_hash_label(p)) {
                by_rs.entry((*uid).to_owned()).or_default().push(pod);
            }
        }
        if rollout::old_pods_running(fam.new.as_ref(), &fam.old(), &by_rs) {
            return self.sync_rollout_status(&fam).await;
        }
        if fam.new.is_none() {
            fam = self.family(rs_list, true).await?;
        }
        if let Some(new) = fam.new.clone() {
            let (_, written) = self.scale_to(&new, rollout::replicas(&self.d)).await?;
            fam.replace(written);
        }
        if progress::deployment_complete(&self.d, &self.status()) {
            self.clean_up(&fam).await?;
        }
        self.sync_rollout_status(&fam).await
    }

    /// Deletes old ReplicaSets beyond `revisionHistoryLimit` (`cleanupDeployment`).
    async fn clean_up(&self, fam: &Family) -> Result<(), Error> {
        for rs in rollout::history_to_clean_up(&self.d, &fam.old()) {
            let name = rs.metadata.name.as_deref().unwrap_or("");
            tracing::debug!(deployment = %self.key, replicaset = %name, "cleaning up an old replica set");
            match self.rs_api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(Error::api("cleaning up old replica sets", &self.key, e)),
            }
        }
        Ok(())
    }

    /// Writes the counts and `Available` if they changed (`syncDeploymentStatus`).
    async fn sync_status(&mut self, fam: &Family) -> Result<Action, Error> {
        let status = progress::calculate_status(&fam.all(), fam.new.as_ref(), &self.d, self.now);
        if !semantically_equal(&self.status(), &status) {
            self.write_status(status).await?;
        }
        Ok(Action::await_change())
    }

    /// Writes the status of a rollout step if it changed, and looks again in time to notice the
    /// progress deadline (`syncRolloutStatus`, `requeueStuckDeployment`).
    async fn sync_rollout_status(&mut self, fam: &Family) -> Result<Action, Error> {
        let status = progress::rollout_status(&fam.all(), fam.new.as_ref(), &self.d, self.now);
        let recheck = progress::recheck_progress_in(&self.d, &status, self.now);
        if !semantically_equal(&self.status(), &status) {
            self.write_status(status).await?;
        }
        Ok(recheck.map(Action::requeue).unwrap_or_else(Action::await_change))
    }
}
