//! The shell of the controllers that keep one named object in every active namespace (the
//! `default` ServiceAccount, the `kube-root-ca.crt` ConfigMap): what the object should be is
//! each controller's [`Ensured`]; creating, repairing and retrying it is here.
//!
//! A kube `Controller` over namespaces, also woken by every change to an object of that name
//! (watched with a `metadata.name` field selector), so a deleted object is made again and an
//! edited one repaired. Each reconcile of an active namespace reads the object live: missing, it
//! is created; present, it is replaced with [`Ensured::repaired`] when that says so. Nothing is
//! created in a namespace that is not active (being deleted): a create refused because the
//! namespace is terminating or gone is not retried. Failures are retried with per-namespace
//! back-off, as client-go's default rate limiter does.

use std::fmt::Debug;
use std::sync::Arc;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Context;
use crate::workloads::retry::Retry;
use crate::workloads::{is_already_exists, is_not_found, namespace_terminating};

/// Namespaces worked on at once: upstream runs one worker for each of these controllers.
const CONCURRENCY: u16 = 1;

/// One controller's object: its name in every namespace and what it should hold.
pub trait Ensured: Send + Sync + 'static {
    type Object: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + DeserializeOwned
        + Serialize
        + Send
        + Sync
        + 'static;
    /// The controller's name in `--controllers` and logs.
    const CONTROLLER: &'static str;
    /// The object's name in every namespace.
    const NAME: &'static str;

    /// The object to create in a namespace that has none.
    fn desired(&self) -> Self::Object;
    /// What to write over `existing`, or `None` when it is fine as it is.
    fn repaired(&self, existing: &Self::Object) -> Option<Self::Object>;
}

#[derive(Debug, thiserror::Error)]
#[error("cannot {step} {object} in namespace {namespace}")]
pub struct Error {
    step: &'static str,
    object: &'static str,
    namespace: String,
    #[source]
    source: kube::Error,
}

/// Whether new objects may go into the namespace: it is not being deleted, and its phase is
/// `Active` (or not reported yet).
pub fn is_active(ns: &Namespace) -> bool {
    ns.metadata.deletion_timestamp.is_none()
        && ns.status.as_ref().and_then(|s| s.phase.as_deref()).is_none_or(|phase| phase == "Active")
}

struct State<E> {
    ctx: Arc<Context>,
    ensured: E,
    retry: Retry,
}

/// Runs the controller keeping `E`'s object in every active namespace until the future is dropped.
pub async fn run<E: Ensured>(ctx: Arc<Context>, ensured: E) {
    let client = ctx.client.clone();
    let state = Arc::new(State { ctx, ensured, retry: Retry::default() });
    let named = watcher::Config::default().fields(&format!("metadata.name={}", E::NAME));
    let results = Controller::new(Api::<Namespace>::all(client.clone()), watcher::Config::default())
        .watches(Api::<E::Object>::all(client), named, |obj: E::Object| {
            obj.namespace().map(|ns| ObjectRef::<Namespace>::new(&ns))
        })
        .with_config(controller::Config::default().concurrency(CONCURRENCY))
        .run(reconcile::<E>, error_policy::<E>, state);
    crate::log_failures(results, E::CONTROLLER).await
}

fn error_policy<E: Ensured>(ns: Arc<Namespace>, e: &Error, state: Arc<State<E>>) -> Action {
    let delay = state.retry.failed(&ns.name_any());
    tracing::warn!(controller = E::CONTROLLER, error = %e, retry_in = ?delay, "sync failed");
    Action::requeue(delay)
}

async fn reconcile<E: Ensured>(ns: Arc<Namespace>, state: Arc<State<E>>) -> Result<Action, Error> {
    let namespace = ns.name_any();
    if !is_active(&ns) {
        return Ok(Action::await_change());
    }
    let api: Api<E::Object> = Api::namespaced(state.ctx.client.clone(), &namespace);
    let name = namespace.as_str();
    let err = |step| move |source| Error { step, object: E::NAME, namespace: name.to_string(), source };
    match api.get_opt(E::NAME).await.map_err(err("read"))? {
        None => match api.create(&PostParams::default(), &state.ensured.desired()).await {
            Ok(_) => tracing::info!(controller = E::CONTROLLER, namespace, object = E::NAME, "created"),
            // Someone else made it, or the namespace is going: nothing to do.
            Err(e) if is_already_exists(&e) || is_not_found(&e) || namespace_terminating(&e) => {}
            Err(e) => return Err(err("create")(e)),
        },
        Some(existing) => {
            if let Some(repaired) = state.ensured.repaired(&existing) {
                // A conflict is an error: the next try reads the newer object.
                api.replace(E::NAME, &PostParams::default(), &repaired).await.map_err(err("update"))?;
                tracing::info!(controller = E::CONTROLLER, namespace, object = E::NAME, "restored");
            }
        }
    }
    state.retry.succeeded(&namespace);
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn namespace(v: serde_json::Value) -> Namespace {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn an_active_namespace_takes_new_objects_and_a_terminating_one_does_not() {
        assert!(is_active(&namespace(json!({"metadata": {"name": "a"}, "status": {"phase": "Active"}}))));
        assert!(is_active(&namespace(json!({"metadata": {"name": "a"}}))), "no phase yet is active");
        assert!(!is_active(&namespace(json!({"metadata": {"name": "a"}, "status": {"phase": "Terminating"}}))));
        assert!(!is_active(&namespace(json!({
            "metadata": {"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": "Active"}
        }))));
    }
}
