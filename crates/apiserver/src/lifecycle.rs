//! Built-in housekeeping of the control plane: the initial namespaces and periodic compaction
//! of store history. Terminating namespaces are emptied and finalized by the namespace
//! controller (`berth-controllers`), through the API, as kube-controller-manager's does.

use std::sync::Arc;
use std::time::Duration;

use berth_api::resources::NAMESPACES;
use serde_json::json;

use crate::objects;
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
