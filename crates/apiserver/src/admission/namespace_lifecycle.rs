//! NamespaceLifecycle: nothing is created in a namespace that does not exist or is being
//! terminated, and the namespaces the system needs are never deleted, as Kubernetes' plugin of
//! that name.

use berth_api::resources::NAMESPACES;
use serde_json::json;

use super::{Attributes, Operation};
use crate::{ApiError, ApiResult, ApiState, objects};

/// Namespaces that may not be deleted (upstream's immortal namespaces).
pub const IMMORTAL_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public"];

pub async fn admit(state: &ApiState, attrs: &Attributes<'_>) -> ApiResult<()> {
    let rt = attrs.target.rt;
    let is_namespace = std::ptr::eq(rt, &NAMESPACES);
    if attrs.operation == Operation::Delete && is_namespace && IMMORTAL_NAMESPACES.contains(&attrs.name) {
        return Err(ApiError::forbidden(&NAMESPACES, attrs.name, "this namespace may not be deleted"));
    }
    // Namespaces themselves, cluster-scoped kinds and deletes of content always pass.
    if is_namespace || !rt.namespaced || attrs.operation != Operation::Create {
        return Ok(());
    }
    let Some(ns) = attrs.target.namespace.as_deref() else { return Ok(()) };
    let kv = state
        .store
        .get(&objects::key(&NAMESPACES, None, ns))
        .await
        .map_err(|e| ApiError::from_store(e, &NAMESPACES, ns))?
        .ok_or_else(|| ApiError::namespace_not_found(ns))?;
    let namespace = objects::decode_kv(&NAMESPACES, &kv)?;
    if objects::is_deleting(&namespace) {
        let mut e = ApiError::forbidden(
            rt,
            attrs.name,
            &format!("unable to create new content in namespace {ns} because it is being terminated"),
        );
        if let Some(d) = e.details.as_mut() {
            d["causes"] = json!([{"reason": "NamespaceTerminating", "message": format!("namespace {ns} is being terminated"), "field": "metadata.namespace"}]);
        }
        return Err(e);
    }
    Ok(())
}
