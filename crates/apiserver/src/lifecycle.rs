//! Built-in housekeeping of the control plane: the initial namespaces, namespace termination
//! (delete the contents, then finalize), and periodic compaction of store history.

use std::sync::Arc;
use std::time::Duration;

use berth_api::resources::{ALL, EVENTS_V1, NAMESPACES};
use berth_store::ListOptions;
use serde_json::{Value, json};

use crate::handlers::delete_object;
use crate::objects;
use crate::request::{Query, Target};
use crate::{ApiError, ApiResult, ApiState};

/// Namespaces that exist from the start, as in Kubernetes.
pub const SYSTEM_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// Creates the system namespaces that are missing.
pub async fn bootstrap(state: &ApiState) -> ApiResult<()> {
    for ns in SYSTEM_NAMESPACES {
        let key = objects::key(&NAMESPACES, None, ns);
        if state.store.get(&key).await.map_err(|e| ApiError::from_store(e, &NAMESPACES, ns))?.is_some() {
            continue;
        }
        let mut obj = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": ns,
                "uid": uuid::Uuid::new_v4().to_string(),
                "creationTimestamp": objects::now_rfc3339(),
                "labels": {"kubernetes.io/metadata.name": ns},
            },
        });
        berth_api::kinds::prepare_for_create(&NAMESPACES, &mut obj);
        match state.store.create(&key, objects::encode(&NAMESPACES, &obj)).await {
            Ok(_) | Err(berth_store::StoreError::AlreadyExists { .. }) => {}
            Err(e) => return Err(ApiError::from_store(e, &NAMESPACES, ns)),
        }
    }
    Ok(())
}

/// Drives terminating namespaces to deletion for as long as the server runs.
pub async fn run_namespace_lifecycle(state: Arc<ApiState>) {
    loop {
        let busy = match finalize_pass(&state).await {
            Ok(busy) => busy,
            Err(e) => {
                tracing::warn!(error = %e.message, "namespace lifecycle pass failed");
                true
            }
        };
        let wait = if busy { Duration::from_millis(500) } else { Duration::from_secs(60) };
        tokio::select! {
            _ = state.namespace_deleted.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// One pass over terminating namespaces; true while some are still terminating.
async fn finalize_pass(state: &ApiState) -> ApiResult<bool> {
    let res = state
        .store
        .list(&objects::prefix(&NAMESPACES, None), &ListOptions::default())
        .await
        .map_err(|e| ApiError::from_store(e, &NAMESPACES, ""))?;
    let mut busy = false;
    for kv in &res.items {
        let nsobj = objects::decode_kv(&NAMESPACES, kv)?;
        if !objects::is_deleting(&nsobj) {
            continue;
        }
        busy = true;
        let ns = objects::name(&nsobj).to_string();
        let mut remaining = 0;
        for rt in ALL.iter().filter(|r| r.namespaced && !std::ptr::eq(**r, &EVENTS_V1)) {
            let prefix = objects::prefix(rt, Some(&ns));
            let items = state
                .store
                .list(&prefix, &ListOptions::default())
                .await
                .map_err(|e| ApiError::from_store(e, rt, ""))?
                .items;
            for item in items {
                remaining += 1;
                let obj = objects::decode_kv(rt, &item)?;
                if objects::is_deleting(&obj) {
                    continue;
                }
                let target = Target { rt, namespace: Some(ns.clone()), name: None, subresource: None };
                match delete_object(state, &target, objects::name(&obj), &Query::default(), b"").await {
                    Ok(_) => {}
                    Err(e) if e.code == 404 => {}
                    Err(e) => tracing::warn!(namespace = ns, error = %e.message, "deleting namespace content failed"),
                }
            }
        }
        if remaining == 0 {
            finalize(state, &ns, kv.mod_revision, nsobj).await?;
        }
    }
    Ok(busy)
}

/// Removes the `kubernetes` finalizer of an empty terminating namespace, and the namespace itself
/// when nothing else holds it.
async fn finalize(state: &ApiState, ns: &str, rev: i64, mut nsobj: Value) -> ApiResult<()> {
    let key = objects::key(&NAMESPACES, None, ns);
    if let Some(list) = nsobj.pointer_mut("/spec/finalizers").and_then(Value::as_array_mut) {
        list.retain(|f| f != "kubernetes");
    }
    let spec_empty = nsobj.pointer("/spec/finalizers").and_then(Value::as_array).is_none_or(Vec::is_empty);
    let result = if spec_empty && objects::finalizers(&nsobj).is_empty() {
        state.store.delete(&key, Some(rev)).await.map(|_| ())
    } else {
        state.store.update(&key, objects::encode(&NAMESPACES, &nsobj), rev).await.map(|_| ())
    };
    match result {
        Ok(()) | Err(berth_store::StoreError::Conflict { .. }) | Err(berth_store::StoreError::NotFound { .. }) => {
            Ok(())
        }
        Err(e) => Err(ApiError::from_store(e, &NAMESPACES, ns)),
    }
}

/// Every `interval`, forgets history older than the revision seen one interval before, as
/// Kubernetes' apiserver compacts etcd every five minutes.
pub async fn run_compactor(state: Arc<ApiState>, interval: Duration) {
    let mut previous: Option<i64> = None;
    loop {
        tokio::time::sleep(interval).await;
        match state.store.current_revision().await {
            Ok(now) => {
                if let Some(rev) = previous.filter(|r| *r > 0) {
                    if let Err(e) = state.store.compact(rev).await {
                        tracing::warn!(error = %e, revision = rev, "compaction failed");
                    } else {
                        tracing::info!(revision = rev, "compacted store history");
                    }
                }
                previous = Some(now);
            }
            Err(e) => tracing::warn!(error = %e, "reading the current revision failed"),
        }
    }
}
