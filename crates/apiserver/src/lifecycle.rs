//! Built-in housekeeping of the control plane: the initial namespaces and periodic compaction
//! of store history. Terminating namespaces are emptied and finalized by the namespace
//! controller (`berth-controllers`), through the API, as kube-controller-manager's does.

use std::sync::Arc;
use std::time::Duration;

use berth_api::resources::NAMESPACES;
use serde_json::json;

use crate::objects;
use crate::{ApiError, ApiResult, ApiState};
use berth_store::{Store, StoreError};

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
                "creationTimestamp": berth_common::time::now_rfc3339(),
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

/// The key through which API servers sharing a store take turns at compaction. Its value is the
/// revision the last compaction round recorded; that round's winner compacts up to it one round
/// later, so history of at least one interval is kept.
pub const COMPACTION_KEY: &str = "/registry/berth/compaction";

/// Every `interval`, forgets history older than the revision seen one interval before, as
/// Kubernetes' apiserver compacts etcd every five minutes. With several servers on one store,
/// only one compacts per interval: a server takes a round only if nobody wrote the compaction key
/// since its last look, and takes it with a compare-and-swap on that key, as kube-apiserver does.
pub async fn run_compactor(state: Arc<ApiState>, interval: Duration) {
    // The compaction key's revision when this server last looked.
    let mut seen: Option<i64> = None;
    loop {
        tokio::time::sleep(interval).await;
        match compaction_round(state.store.as_ref(), &mut seen).await {
            Ok(Some(rev)) => tracing::info!(revision = rev, "compacted store history"),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "compaction failed"),
        }
    }
}

/// One compaction round: returns the revision compacted to, if this server took the round.
async fn compaction_round(store: &dyn Store, seen: &mut Option<i64>) -> Result<Option<i64>, StoreError> {
    let now = store.current_revision().await?.to_string().into_bytes();
    let Some(kv) = store.get(COMPACTION_KEY).await? else {
        match store.create(COMPACTION_KEY, now).await {
            Ok(kv) => *seen = Some(kv.mod_revision),
            Err(StoreError::AlreadyExists { .. }) => *seen = None,
            Err(e) => return Err(e),
        }
        return Ok(None);
    };
    if *seen != Some(kv.mod_revision) {
        // Another server took a round since (or this server just started): wait one more.
        *seen = Some(kv.mod_revision);
        return Ok(None);
    }
    match store.update(COMPACTION_KEY, now, kv.mod_revision).await {
        Ok(mine) => *seen = Some(mine.mod_revision),
        Err(StoreError::Conflict { current, .. }) => {
            *seen = current.map(|c| c.mod_revision);
            return Ok(None);
        }
        Err(e) => return Err(e),
    }
    let target = std::str::from_utf8(&kv.value).ok().and_then(|v| v.parse::<i64>().ok()).filter(|r| *r > 0);
    match target {
        Some(rev) => store.compact(rev).await.map(|()| Some(rev)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use berth_store::sqlite::SqliteStore;

    use super::*;

    #[tokio::test]
    async fn two_servers_on_one_store_take_turns_and_history_of_one_round_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("store.db")).unwrap();
        let (mut a, mut b) = (None, None);
        let mut compactions = Vec::new();
        for round in 0..6 {
            store.create(&format!("/k/{round}"), b"v".to_vec()).await.unwrap();
            let before = store.current_revision().await.unwrap();
            // Both servers' timers fire in the same interval.
            let by_a = compaction_round(&store, &mut a).await.unwrap();
            let by_b = compaction_round(&store, &mut b).await.unwrap();
            assert!(by_a.is_none() || by_b.is_none(), "round {round}: both compacted");
            if let Some(rev) = by_a.or(by_b) {
                assert!(rev < before, "round {round}: compacted to {rev}, the latest revision being {before}");
                compactions.push(rev);
            }
        }
        assert!(compactions.len() >= 2, "compactions: {compactions:?}");
        assert!(compactions.windows(2).all(|w| w[0] < w[1]), "compactions: {compactions:?}");
        assert_eq!(store.compacted_revision().await.unwrap(), *compactions.last().unwrap());
    }
}
