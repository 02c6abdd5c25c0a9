//! The namespace controller: empties a terminating namespace of every namespaced resource the
//! server serves, then removes its `kubernetes` finalizer through `namespaces/{name}/finalize`,
//! after which the server removes it — kube-controller-manager's namespace controller, through
//! the API only.
//!
//! Each reconcile of a namespace with a `deletionTimestamp` reads it live, discovers the served
//! resources, deletes each namespaced resource's collection (Background, so that the garbage
//! collector adds no `orphan` finalizer), lists what is left, and records how that went in the
//! namespace's deletion conditions ([`conditions`]). Content still there is looked at again:
//! after half the pods' grace period, after 15 s when finalizers hold it, otherwise with
//! per-namespace back-off (5 ms doubling to 60 s) as any failure.

pub mod conditions;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::watcher;

use self::conditions::Outcome;
use crate::Context;
use crate::garbage_collector::resources::{self, Served};

/// The finalizer this controller owns in `spec.finalizers`.
pub const FINALIZER: &str = "kubernetes";
/// Namespaces worked on at once (`--concurrent-namespace-syncs`).
const CONCURRENCY: u16 = 10;
/// How long content held by finalizers is given before the next look (upstream's estimate).
const FINALIZER_ESTIMATE: Duration = Duration::from_secs(15);
const BACKOFF_BASE: Duration = Duration::from_millis(5);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {step} namespace {namespace}")]
    Namespace {
        step: &'static str,
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot delete the content of namespace {namespace}: {}", failures.join("; "))]
    Content { namespace: String, failures: Vec<String> },
}

struct Namespaces {
    ctx: Arc<Context>,
    /// Failures in a row, per namespace, for the back-off.
    failures: Mutex<HashMap<String, u32>>,
}

/// Runs the namespace controller until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    let state = Arc::new(Namespaces { ctx, failures: Mutex::new(HashMap::new()) });
    Controller::new(api, watcher::Config::default())
        .with_config(controller::Config::default().concurrency(CONCURRENCY))
        .run(reconcile, error_policy, state)
        .for_each(|_| futures::future::ready(()))
        .await
}

fn error_policy(ns: Arc<Namespace>, e: &Error, state: Arc<Namespaces>) -> Action {
    let name = ns.metadata.name.clone().unwrap_or_default();
    let mut failures = state.failures.lock().unwrap_or_else(|e| e.into_inner());
    let n = failures.entry(name.clone()).or_insert(0);
    let delay = BACKOFF_BASE.saturating_mul(2u32.saturating_pow(*n)).min(BACKOFF_MAX);
    *n = n.saturating_add(1);
    tracing::info!(namespace = name, error = %e, retry_in = ?delay, "namespace: deletion not finished");
    Action::requeue(delay)
}

async fn reconcile(ns: Arc<Namespace>, state: Arc<Namespaces>) -> Result<Action, Error> {
    let name = ns.metadata.name.clone().unwrap_or_default();
    if ns.metadata.deletion_timestamp.is_none() {
        return Ok(Action::await_change());
    }
    let action = delete_namespace(&state.ctx.client, &name).await?;
    state.failures.lock().unwrap_or_else(|e| e.into_inner()).remove(&name);
    Ok(action)
}

/// One step of a namespace's deletion (upstream's `namespacedResourcesDeleter.Delete`).
async fn delete_namespace(client: &kube::Client, name: &str) -> Result<Action, Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    let err = |step| move |source| Error::Namespace { step, namespace: name.to_string(), source };
    let Some(mut ns) = api.get_opt(name).await.map_err(err("read"))? else { return Ok(Action::await_change()) };
    let Some(deleted_at) = ns.metadata.deletion_timestamp.clone() else { return Ok(Action::await_change()) };
    if ns.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Terminating") {
        let patch = serde_json::json!({"status": {"phase": "Terminating"}});
        ns = api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(err("mark"))?;
    }
    let finalizers = ns.spec.as_ref().and_then(|s| s.finalizers.clone()).unwrap_or_default();
    if !finalizers.iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }

    let outcome = delete_content(client, name, deleted_at.0).await;
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now());
    let old = ns.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    if let Some(new) = conditions::updated(&old, &outcome, now) {
        let patch = serde_json::json!({"status": {"conditions": new}});
        if let Err(e) = api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            tracing::debug!(namespace = name, error = %e, "namespace: cannot update the deletion conditions");
        }
    }
    let errors = outcome.errors();
    if !errors.is_empty() {
        return Err(Error::Content { namespace: name.into(), failures: errors });
    }
    if let Some(estimate) = outcome.estimate {
        tracing::debug!(namespace = name, remaining = ?outcome.remaining, "namespace: content is going");
        return Ok(Action::requeue(estimate / 2 + Duration::from_secs(1)));
    }

    // Empty: remove our finalizer; the server removes the namespace once none is left.
    let mut finalized = ns.clone();
    if let Some(spec) = finalized.spec.as_mut() {
        spec.finalizers = Some(finalizers.into_iter().filter(|f| f != FINALIZER).collect());
    }
    match api.replace_subresource::<Namespace>("finalize", name, &PostParams::default(), &finalized).await {
        Ok(_) => tracing::info!(namespace = name, "namespace: content deleted; namespace finalized"),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(err("finalize")(e)),
    }
    Ok(Action::await_change())
}

/// Deletes every namespaced resource's content and tells what is left.
async fn delete_content(client: &kube::Client, ns: &str, deleted_at: jiff::Timestamp) -> Outcome {
    let mut outcome = Outcome::default();
    let served = match resources::discover(client).await {
        Ok(all) => all,
        Err(e) => {
            outcome.discovery_failure = Some(e.to_string());
            return outcome;
        }
    };
    let mut estimate = Duration::ZERO;
    for s in served.iter().filter(|s| s.namespaced && s.supports("delete")) {
        let resource = format!("{}.{}", s.resource.plural, s.resource.group);
        let mut grace = Duration::ZERO;
        if s.resource.kind == "Pod" && s.resource.group.is_empty() {
            match pods_grace(client, ns, deleted_at).await {
                Ok(g) => grace = g,
                Err(e) => {
                    outcome.failures.push(format!("{resource}: {e}"));
                    continue;
                }
            }
        }
        match delete_resource(client, s, ns).await {
            Ok((0, _)) => {}
            Ok((n, finalizers)) => {
                outcome.remaining.insert(resource.clone(), n);
                if !grace.is_zero() {
                    estimate = estimate.max(grace);
                } else if !finalizers.is_empty() {
                    estimate = estimate.max(FINALIZER_ESTIMATE);
                } else {
                    outcome.failures.push(format!("unexpected items still remain in namespace: {ns} for {resource}"));
                }
                for (f, count) in finalizers {
                    *outcome.finalizers.entry(f).or_insert(0) += count;
                }
            }
            Err(e) => outcome.failures.push(format!("{resource}: {e}")),
        }
    }
    outcome.estimate = (!estimate.is_zero()).then_some(estimate);
    outcome
}

/// The longest grace period of the namespace's running pods, if the namespace was deleted less
/// than that long ago (upstream's `estimateGracefulTerminationForPods`).
async fn pods_grace(client: &kube::Client, ns: &str, deleted_at: jiff::Timestamp) -> Result<Duration, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut grace = 0i64;
    for p in pods.list(&ListParams::default()).await? {
        let finished = matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
        if !finished {
            grace = grace.max(p.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(0));
        }
    }
    let grace = Duration::from_secs(grace.max(0) as u64);
    let since: Duration = jiff::Timestamp::now().duration_since(deleted_at).try_into().unwrap_or(Duration::ZERO);
    Ok(if since >= grace { Duration::ZERO } else { grace })
}

/// Deletes one resource's objects in the namespace; returns how many are left and the
/// finalizers holding them.
async fn delete_resource(
    client: &kube::Client,
    s: &Served,
    ns: &str,
) -> Result<(usize, BTreeMap<String, usize>), kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &s.resource);
    let background = DeleteParams::background();
    if s.supports("deletecollection") {
        api.delete_collection(&background, &ListParams::default()).await?;
    } else if s.supports("list") {
        for obj in api.list_metadata(&ListParams::default()).await? {
            let name = obj.metadata.name.unwrap_or_default();
            match api.delete(&name, &background).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 405 => {}
                Err(e) => return Err(e),
            }
        }
    }
    if !s.supports("list") {
        return Ok((0, BTreeMap::new()));
    }
    let meta: Api<PartialObjectMeta<DynamicObject>> = Api::namespaced_with(client.clone(), ns, &s.resource);
    let left = meta.list(&ListParams::default()).await?;
    let mut finalizers = BTreeMap::new();
    for obj in &left.items {
        for f in obj.metadata.finalizers.iter().flatten() {
            *finalizers.entry(f.clone()).or_insert(0) += 1;
        }
    }
    Ok((left.items.len(), finalizers))
}
