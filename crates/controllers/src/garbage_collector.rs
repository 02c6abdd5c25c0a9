//! The garbage collector: deletes objects whose owners are all gone, strips the references to an
//! owner deleted with the `orphan` finalizer, and holds an owner deleted in the foreground until
//! its blocking dependents are gone — kube-controller-manager's garbage collector, through the
//! API only.
//!
//! Every served resource that can be listed, watched, patched and deleted (events aside) is
//! found through discovery (again every [`RESYNC`]) and watched as metadata only. The watches
//! feed one task that owns the [`graph::Graph`] and the [`queue::WorkQueue`]; up to [`WORKERS`]
//! workers take [`graph::Work`] items, each with a view of its node taken when it starts, and
//! act through the API:
//!
//! | work | reads | writes |
//! |---|---|---|
//! | `AttemptToDelete` (object) | live GET of it and of each owner | patch out references to gone owners, or delete it (preconditions UID and resourceVersion; Background, or Foreground when an owner waits and it has dependents) |
//! | `AttemptToDelete` (foreground owner) | live GET of it; its blocking dependents from the graph | remove `foregroundDeletion` once none is left |
//! | `AttemptToOrphan` (owner) | live GET of each dependent | patch out the reference to it, then remove `orphan` |
//!
//! Nothing is deleted on the graph's word alone: an owner counts as gone only when a live GET
//! finds no object with its UID (a missing node in the graph is only a reason to look). A
//! reference to a kind the server does not serve keeps its object (retried with back-off).
//! Watches of different kinds are not ordered with each other, so a dependent can reach the
//! graph after its owner's orphaning began: the collector remembers the owners it orphans for
//! [`ORPHANED_MEMORY`], and such a dependent loses its reference instead of being deleted.
//! Work starts once every watch has listed its resource (or after [`RESYNC`] at the latest).

pub mod decide;
pub mod graph;
pub mod queue;
pub mod resources;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions, PropagationPolicy};
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;

use self::decide::{Classified, Decision, ForegroundStep, OwnerState};
use self::graph::{Change, FOREGROUND_FINALIZER, Graph, Identity, NodeView, ORPHAN_FINALIZER, Observed, Uid, Work};
use self::queue::WorkQueue;
use self::resources::{Kinds, Served};
use crate::Context;

/// Workers acting at once (kube-controller-manager's `--concurrent-gc-syncs`).
pub const WORKERS: usize = 20;
/// How often served resources are discovered again (upstream's 30 s resource sync).
pub const RESYNC: Duration = Duration::from_secs(30);
/// Until discovery first succeeds, it is tried this often.
const DISCOVERY_RETRY: Duration = Duration::from_secs(1);
/// How long the collector remembers an owner it orphans the dependents of: a dependent whose
/// watch event comes after the owner's (watches of different kinds are not ordered) loses its
/// reference instead of being deleted with the owner gone.
pub const ORPHANED_MEMORY: Duration = Duration::from_secs(600);
/// Attempts of a read-modify-write that keeps meeting conflicts, within one work item.
const CONFLICT_RETRIES: usize = 5;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the server serves no {kind} in {api_version}")]
    UnknownKind { api_version: String, kind: String },
    #[error("cluster-scoped {object} names the namespaced owner {kind} {name}")]
    NamespacedOwner { object: String, kind: String, name: String },
    #[error("cannot {step} {object}")]
    Api {
        step: &'static str,
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error("{object} kept changing while its {what} were updated")]
    Conflict { object: String, what: &'static str },
}

fn api_err<'a>(step: &'static str, object: &'a Identity) -> impl FnOnce(kube::Error) -> Error + 'a {
    move |source| Error::Api { step, object: object.to_string(), source }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Runs the garbage collector until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    Collector::new(ctx).run().await
}

/// What a watch task tells the collector.
enum Msg {
    Change(Change),
    /// The watch of this group and kind has listed it once.
    Synced(GroupKind),
}

type GroupKind = (String, String);

/// How one work item ended.
enum Outcome {
    Done,
    /// Failed; try again after back-off.
    Retry(Error),
    /// Failed in a way retrying cannot mend.
    GiveUp(Error),
    /// The object does not exist (any more): the graph drops its node.
    Absent(Identity),
    /// A foreground owner still waits: check these dependents.
    Check(Vec<Uid>),
    /// Handled, but the object is known only from references so far: look again later.
    Unobserved,
}

struct Collector {
    ctx: Arc<Context>,
    graph: Graph,
    queue: WorkQueue<Work>,
    kinds: Arc<Kinds>,
    watches: HashMap<GroupKind, AbortHandle>,
    /// Watches of the first discovery that have not listed their resource yet.
    unsynced: HashSet<GroupKind>,
    discovered: bool,
    /// Owners whose dependents are orphaned, and since when.
    orphaned: HashMap<Uid, Instant>,
}

impl Collector {
    fn new(ctx: Arc<Context>) -> Collector {
        Collector {
            ctx,
            graph: Graph::default(),
            queue: WorkQueue::default(),
            kinds: Arc::new(Kinds::default()),
            watches: HashMap::new(),
            unsynced: HashSet::new(),
            discovered: false,
            orphaned: HashMap::new(),
        }
    }

    async fn run(mut self) {
        let (tx, mut rx) = mpsc::channel::<Msg>(1024);
        let mut watch_tasks = JoinSet::new();
        let mut workers: JoinSet<(Work, Outcome)> = JoinSet::new();
        let mut next_discovery = Instant::now();
        // Work waits for every watch to list its resource, but not for ever: a resource whose
        // list keeps failing must not stop the collector (every deletion is checked live).
        let sync_deadline = Instant::now() + RESYNC;
        let mut warned = false;
        loop {
            let synced = self.unsynced.is_empty();
            if self.discovered && !synced && !warned && Instant::now() >= sync_deadline {
                tracing::warn!(unsynced = ?self.unsynced, "garbage collector: starting before every resource was listed");
                warned = true;
            }
            let working = self.discovered && (synced || warned);
            if working {
                while workers.len() < WORKERS {
                    let Some(work) = self.queue.pop(Instant::now()) else { break };
                    self.start(work, &mut workers);
                }
            }
            // Delayed work matters only when a worker is free to take it.
            let due = self.queue.next_due().filter(|_| working && workers.len() < WORKERS);
            tokio::select! {
                Some(msg) = rx.recv() => self.handle(msg),
                Some(joined) = workers.join_next(), if !workers.is_empty() => match joined {
                    Ok((work, outcome)) => self.finish(work, outcome),
                    Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                    Err(_) => {}
                },
                _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {}
                _ = tokio::time::sleep_until(sync_deadline), if !warned && !self.unsynced.is_empty() => {}
                _ = tokio::time::sleep_until(next_discovery) => {
                    next_discovery = Instant::now() + match self.sync_resources(&mut watch_tasks, &tx).await {
                        Ok(()) => RESYNC,
                        Err(e) => {
                            tracing::warn!(error = %e, "garbage collector: discovery failed");
                            if self.discovered { RESYNC } else { DISCOVERY_RETRY }
                        }
                    };
                }
            }
        }
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Change(change) => {
                for work in self.graph.apply(change) {
                    self.queue.add(work);
                }
            }
            Msg::Synced(gk) => {
                if self.unsynced.remove(&gk) && self.unsynced.is_empty() {
                    tracing::info!(objects = self.graph.len(), "garbage collector: all resources listed");
                }
            }
        }
    }

    fn start(&mut self, work: Work, workers: &mut JoinSet<(Work, Outcome)>) {
        let uid = match &work {
            Work::AttemptToDelete(uid) | Work::AttemptToOrphan(uid) => uid,
        };
        let Some(mut view) = self.graph.view(uid) else {
            // Gone from the graph meanwhile: nothing to do.
            self.queue.done(&work);
            self.queue.forget(&work);
            return;
        };
        match &work {
            Work::AttemptToDelete(_) => {
                view.orphaned_owners =
                    self.graph.owners_of(uid).filter(|o| self.orphaned.contains_key(*o)).cloned().collect();
            }
            // Remembered before its finalizer goes, so the owner's deletion event cannot
            // overtake it.
            Work::AttemptToOrphan(_) => {
                let now = Instant::now();
                self.orphaned.retain(|_, at| now.duration_since(*at) < ORPHANED_MEMORY);
                self.orphaned.insert(uid.clone(), now);
            }
        }
        let client = self.ctx.client.clone();
        let kinds = self.kinds.clone();
        workers.spawn(async move {
            let outcome = match &work {
                Work::AttemptToDelete(_) => attempt_to_delete(&client, &kinds, &view).await,
                Work::AttemptToOrphan(_) => attempt_to_orphan(&client, &kinds, &view).await,
            };
            (work, outcome)
        });
    }

    fn finish(&mut self, work: Work, outcome: Outcome) {
        self.queue.done(&work);
        match outcome {
            Outcome::Done => self.queue.forget(&work),
            Outcome::Retry(e) => {
                tracing::debug!(?work, error = %e, error_source = ?std::error::Error::source(&e), "garbage collector: will retry");
                self.queue.add_rate_limited(work, Instant::now());
            }
            Outcome::GiveUp(e) => {
                tracing::warn!(?work, error = %e, "garbage collector: giving up");
                self.queue.forget(&work);
            }
            Outcome::Absent(identity) => {
                self.queue.forget(&work);
                for w in self.graph.apply(Change::Absent(identity)) {
                    self.queue.add(w);
                }
            }
            Outcome::Check(uids) => {
                self.queue.forget(&work);
                for uid in uids {
                    self.queue.add(Work::AttemptToDelete(uid));
                }
            }
            Outcome::Unobserved => self.queue.add_rate_limited(work, Instant::now()),
        }
    }

    /// Discovers the served resources; watches new ones, stops watching those gone.
    async fn sync_resources(&mut self, tasks: &mut JoinSet<()>, tx: &mpsc::Sender<Msg>) -> Result<(), kube::Error> {
        let all = resources::discover(&self.ctx.client).await?;
        self.kinds = Arc::new(Kinds::new(&all));
        let wanted: HashMap<GroupKind, Served> = resources::collectable(&all)
            .into_iter()
            .map(|s| ((s.resource.group.clone(), s.resource.kind.clone()), s))
            .collect();
        self.watches.retain(|gk, handle| {
            let keep = wanted.contains_key(gk);
            if !keep {
                tracing::info!(group = gk.0, kind = gk.1, "garbage collector: resource no longer served");
                handle.abort();
            }
            keep
        });
        for (gk, served) in wanted {
            if self.watches.contains_key(&gk) {
                continue;
            }
            if !self.discovered {
                self.unsynced.insert(gk.clone());
            }
            let handle = tasks.spawn(watch_resource(self.ctx.client.clone(), served, tx.clone()));
            self.watches.insert(gk, handle);
        }
        self.discovered = true;
        Ok(())
    }
}

/// Watches one resource's metadata and turns its events into graph changes.
async fn watch_resource(client: kube::Client, served: Served, tx: mpsc::Sender<Msg>) {
    let ar = served.resource.clone();
    let gk: GroupKind = (ar.group.clone(), ar.kind.clone());
    let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(client, &ar);
    let mut events = watcher(api, watcher::Config::default()).default_backoff().boxed();
    let mut listing: Option<HashSet<Uid>> = None;
    while let Some(event) = events.next().await {
        let msg = match event {
            Ok(watcher::Event::Init) => {
                listing = Some(HashSet::new());
                continue;
            }
            Ok(watcher::Event::InitApply(obj)) => {
                let o = observed(&ar, obj);
                if let Some(seen) = listing.as_mut() {
                    seen.insert(o.identity.uid.clone());
                }
                Msg::Change(Change::Upsert(o))
            }
            Ok(watcher::Event::Apply(obj)) => Msg::Change(Change::Upsert(observed(&ar, obj))),
            Ok(watcher::Event::Delete(obj)) => Msg::Change(Change::Delete(obj.metadata.uid.unwrap_or_default())),
            Ok(watcher::Event::InitDone) => {
                let present = listing.take().unwrap_or_default();
                let relisted = Change::Relisted { group: gk.0.clone(), kind: gk.1.clone(), present };
                if tx.send(Msg::Change(relisted)).await.is_err() {
                    return;
                }
                Msg::Synced(gk.clone())
            }
            Err(e) => {
                tracing::debug!(kind = ar.kind, error = %e, "garbage collector: watch failed; retrying");
                continue;
            }
        };
        if tx.send(msg).await.is_err() {
            return;
        }
    }
}

fn observed(ar: &kube::discovery::ApiResource, obj: PartialObjectMeta<DynamicObject>) -> Observed {
    let m = obj.metadata;
    Observed {
        identity: Identity {
            api_version: ar.api_version.clone(),
            kind: ar.kind.clone(),
            namespace: m.namespace,
            name: m.name.unwrap_or_default(),
            uid: m.uid.unwrap_or_default(),
        },
        owners: m.owner_references.unwrap_or_default(),
        deleting: m.deletion_timestamp.is_some(),
        finalizers: m.finalizers.unwrap_or_default(),
    }
}

/// The API for objects of `api_version`/`kind`, in `namespace` when the kind is namespaced.
fn api_for(
    client: &kube::Client,
    kinds: &Kinds,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
) -> Result<Api<DynamicObject>, Error> {
    let served = kinds
        .find(api_version, kind)
        .ok_or_else(|| Error::UnknownKind { api_version: api_version.into(), kind: kind.into() })?;
    Ok(match (served.namespaced, namespace) {
        (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &served.resource),
        (true, None) => {
            return Err(Error::NamespacedOwner { object: String::new(), kind: kind.into(), name: String::new() });
        }
        (false, _) => Api::all_with(client.clone(), &served.resource),
    })
}

fn object_api(client: &kube::Client, kinds: &Kinds, id: &Identity) -> Result<Api<DynamicObject>, Error> {
    api_for(client, kinds, &id.api_version, &id.kind, id.namespace.as_deref())
}

/// The object's metadata if an object with its UID exists.
async fn get_live(api: &Api<DynamicObject>, id: &Identity) -> Result<Option<PartialObjectMeta<DynamicObject>>, Error> {
    let got = api.get_metadata_opt(&id.name).await.map_err(api_err("read", id))?;
    Ok(got.filter(|m| m.metadata.uid.as_deref() == Some(id.uid.as_str())))
}

/// Upstream's `attemptToDeleteItem`.
async fn attempt_to_delete(client: &kube::Client, kinds: &Kinds, view: &NodeView) -> Outcome {
    let id = &view.identity;
    let api = match object_api(client, kinds, id) {
        Ok(api) => api,
        Err(e @ Error::NamespacedOwner { .. }) => return Outcome::GiveUp(e),
        Err(e) => return Outcome::Retry(e),
    };
    let latest = match get_live(&api, id).await {
        Ok(Some(m)) => m.metadata,
        Ok(None) => return Outcome::Absent(id.clone()),
        Err(e) => return Outcome::Retry(e),
    };
    let finalizers = latest.finalizers.clone().unwrap_or_default();
    let rv = latest.resource_version.clone().unwrap_or_default();
    if latest.deletion_timestamp.is_some() {
        if !finalizers.iter().any(|f| f == FOREGROUND_FINALIZER) {
            // Being deleted: its deletion event will bring its dependents here.
            return Outcome::Done;
        }
        return match decide::foreground_step(view) {
            ForegroundStep::RemoveFinalizer => {
                tracing::info!(object = %id, "garbage collector: no blocking dependents left; removing foregroundDeletion");
                match remove_finalizer(&api, id, FOREGROUND_FINALIZER).await {
                    Ok(()) => Outcome::Done,
                    Err(e) => Outcome::Retry(e),
                }
            }
            ForegroundStep::Wait { check } => Outcome::Check(check),
        };
    }
    let owners = latest.owner_references.clone().unwrap_or_default();
    if owners.is_empty() {
        return Outcome::Done;
    }
    let mut classified = Classified::default();
    for r in &owners {
        match owner_state(client, kinds, r, id).await {
            Ok(OwnerState::Dangling) if view.orphaned_owners.contains(&r.uid) => classified.orphaned.push(r.clone()),
            Ok(state) => classified.push(r.clone(), state),
            Err(e @ Error::NamespacedOwner { .. }) => return Outcome::GiveUp(e),
            Err(e) => return Outcome::Retry(e),
        }
    }
    let mut look_again = false;
    let result = match decide::decide(&classified, &finalizers, view) {
        Decision::Keep => Ok(()),
        Decision::RemoveReferences(uids) => {
            tracing::info!(object = %id, owners = ?uids, "garbage collector: removing references to owners that are gone");
            let left = decide::without_references(&owners, &uids);
            // Its other owners are decided on with the references gone.
            look_again = !classified.orphaned.is_empty() && !left.is_empty();
            patch_meta(&api, id, &rv, "ownerReferences", &left).await.map(|_| ())
        }
        Decision::Delete { policy, unblock_first } => {
            delete_dependent(&api, id, rv, &owners, policy, unblock_first).await
        }
    };
    match result {
        Err(e) => Outcome::Retry(e),
        Ok(()) if look_again => Outcome::Check(vec![id.uid.clone()]),
        Ok(()) if !view.observed => Outcome::Unobserved,
        Ok(()) => Outcome::Done,
    }
}

/// How the owner `r` of `dependent` stands, by a live GET.
async fn owner_state(
    client: &kube::Client,
    kinds: &Kinds,
    r: &OwnerReference,
    dependent: &Identity,
) -> Result<OwnerState, Error> {
    let api = api_for(client, kinds, &r.api_version, &r.kind, dependent.namespace.as_deref()).map_err(|e| match e {
        Error::NamespacedOwner { kind, .. } => {
            Error::NamespacedOwner { object: dependent.to_string(), kind, name: r.name.clone() }
        }
        e => e,
    })?;
    let owner = Identity::of_owner(r, dependent.namespace.as_deref());
    let Some(live) = get_live(&api, &owner).await? else { return Ok(OwnerState::Dangling) };
    let m = live.metadata;
    let foreground = m.finalizers.unwrap_or_default().iter().any(|f| f == FOREGROUND_FINALIZER);
    Ok(if m.deletion_timestamp.is_some() && foreground { OwnerState::WaitingForDependents } else { OwnerState::Solid })
}

/// Deletes an object none of whose owners keeps it, as it was at `rv` (upstream's
/// `deleteObject`: if it changed meanwhile but its owners did not, it still goes).
async fn delete_dependent(
    api: &Api<DynamicObject>,
    id: &Identity,
    mut rv: String,
    owners: &[OwnerReference],
    policy: PropagationPolicy,
    unblock_first: bool,
) -> Result<(), Error> {
    if unblock_first {
        tracing::info!(object = %id, "garbage collector: unblocking references to break a foreground cycle");
        let patched = patch_meta(api, id, &rv, "ownerReferences", decide::unblocked(owners)).await?;
        match patched {
            Some(obj) => rv = obj.metadata.resource_version.unwrap_or_default(),
            None => return Ok(()),
        }
    }
    tracing::info!(object = %id, ?policy, "garbage collector: deleting an object whose owners are gone");
    let params = |rv: Option<String>| DeleteParams {
        propagation_policy: Some(policy.clone()),
        preconditions: Some(Preconditions { uid: Some(id.uid.clone()), resource_version: rv }),
        ..DeleteParams::default()
    };
    match api.delete(&id.name, &params(Some(rv))).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 404) => Ok(()),
        Err(e) if is_status(&e, 409) => {
            let Some(now) = get_live(api, id).await? else { return Ok(()) };
            if now.metadata.owner_references.unwrap_or_default() != owners {
                return Err(Error::Conflict { object: id.to_string(), what: "owner references" });
            }
            match api.delete(&id.name, &params(None)).await {
                Ok(_) => Ok(()),
                Err(e) if is_status(&e, 404) => Ok(()),
                Err(e) => Err(api_err("delete", id)(e)),
            }
        }
        Err(e) => Err(api_err("delete", id)(e)),
    }
}

/// Merge-patches one metadata field at `rv`; `None` if the object is gone.
async fn patch_meta(
    api: &Api<DynamicObject>,
    id: &Identity,
    rv: &str,
    field: &str,
    value: impl serde::Serialize,
) -> Result<Option<DynamicObject>, Error> {
    let patch = decide::metadata_patch(rv, field, value);
    match api.patch(&id.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(obj) => Ok(Some(obj)),
        Err(e) if is_status(&e, 404) => Ok(None),
        Err(e) => Err(api_err("patch", id)(e)),
    }
}

/// Removes `finalizer` from the live object, re-reading it on conflicts.
async fn remove_finalizer(api: &Api<DynamicObject>, id: &Identity, finalizer: &str) -> Result<(), Error> {
    for _ in 0..CONFLICT_RETRIES {
        let Some(live) = get_live(api, id).await? else { return Ok(()) };
        let finalizers = live.metadata.finalizers.unwrap_or_default();
        if !finalizers.iter().any(|f| f == finalizer) {
            return Ok(());
        }
        let left: Vec<&String> = finalizers.iter().filter(|f| *f != finalizer).collect();
        let rv = live.metadata.resource_version.unwrap_or_default();
        match patch_meta(api, id, &rv, "finalizers", left).await {
            Ok(_) => return Ok(()),
            Err(Error::Api { source, .. }) if is_status(&source, 409) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::Conflict { object: id.to_string(), what: "finalizers" })
}

/// Upstream's `attemptToOrphanWorker`: drops the references to the owner from each dependent,
/// then the owner's `orphan` finalizer.
async fn attempt_to_orphan(client: &kube::Client, kinds: &Kinds, view: &NodeView) -> Outcome {
    let owner = &view.identity;
    for dep in &view.dependents {
        if let Err(e) = remove_reference(client, kinds, &dep.identity, &owner.uid).await {
            return Outcome::Retry(e);
        }
    }
    let api = match object_api(client, kinds, owner) {
        Ok(api) => api,
        Err(e) => return Outcome::Retry(e),
    };
    tracing::info!(object = %owner, dependents = view.dependents.len(), "garbage collector: dependents orphaned; removing the orphan finalizer");
    match remove_finalizer(&api, owner, ORPHAN_FINALIZER).await {
        Ok(()) => Outcome::Done,
        Err(e) => Outcome::Retry(e),
    }
}

/// Removes the reference to `owner_uid` from the live `dependent`, re-reading it on conflicts.
async fn remove_reference(
    client: &kube::Client,
    kinds: &Kinds,
    dependent: &Identity,
    owner_uid: &str,
) -> Result<(), Error> {
    let api = object_api(client, kinds, dependent)?;
    for _ in 0..CONFLICT_RETRIES {
        let Some(live) = get_live(&api, dependent).await? else { return Ok(()) };
        let owners = live.metadata.owner_references.unwrap_or_default();
        if !owners.iter().any(|r| r.uid == owner_uid) {
            return Ok(());
        }
        let left = decide::without_references(&owners, &[owner_uid.to_string()]);
        let rv = live.metadata.resource_version.unwrap_or_default();
        match patch_meta(&api, dependent, &rv, "ownerReferences", left).await {
            Ok(_) => return Ok(()),
            Err(Error::Api { source, .. }) if is_status(&source, 409) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::Conflict { object: dependent.to_string(), what: "owner references" })
}
