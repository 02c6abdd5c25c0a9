//! RuntimeClass: a pod that names no class gets berth's default class (the newest one annotated
//! `runtimeclass.berth.dev/is-default-class: "true"`); a named class must exist; its overhead is
//! copied into the pod and its scheduling merged (mutating), and the pod's overhead must be the
//! class's (validating), as Kubernetes' plugin of that name. The class is looked up once per
//! create and handed from one phase to the other.

use berth_api::resources::{PODS, RUNTIMECLASSES};
use berth_store::ListOptions;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::node::v1::RuntimeClass;
use serde_json::Value;

use super::Attributes;
use crate::{ApiError, ApiResult, ApiState, objects};

/// The class the mutating phase found for the pod (`None`: the pod names none, or it was not
/// found, which that phase has already refused).
#[derive(Debug, Default)]
pub struct Resolved {
    class: Option<RuntimeClass>,
}

fn applies(attrs: &Attributes<'_>) -> bool {
    std::ptr::eq(attrs.target.rt, &PODS) && attrs.target.subresource.is_none()
}

fn decode_pod(obj: &Value) -> ApiResult<Pod> {
    serde_json::from_value(obj.clone()).map_err(|e| ApiError::bad_request(e.to_string()))
}

fn forbidden(attrs: &Attributes<'_>, why: &str) -> ApiError {
    ApiError::forbidden(&PODS, attrs.name, why)
}

/// The mutating phase: fills the default class, then applies the class to the pod.
pub async fn admit(
    state: &ApiState,
    attrs: &Attributes<'_>,
    obj: &mut Value,
    resolved: &mut Resolved,
) -> ApiResult<()> {
    if !applies(attrs) {
        return Ok(());
    }
    let mut pod = decode_pod(obj)?;
    let spec = pod.spec.get_or_insert_with(Default::default);
    let class = match spec.runtime_class_name.clone().filter(|n| !n.is_empty()) {
        Some(name) => get_class(state, &name).await?,
        None => {
            let all = list_classes(state).await?;
            let default = berth_api::admission::default_runtime_class(&all).cloned();
            if let Some(default) = &default {
                spec.runtime_class_name = default.metadata.name.clone();
            }
            default
        }
    };
    berth_api::admission::set_runtime_class(&mut pod, class.as_ref()).map_err(|why| forbidden(attrs, &why))?;
    *obj = serde_json::to_value(&pod).map_err(|e| ApiError::internal(e.to_string()))?;
    resolved.class = class;
    Ok(())
}

/// The validating phase: the pod's overhead against the class found before.
pub fn validate(attrs: &Attributes<'_>, obj: &Value, resolved: &Resolved) -> ApiResult<()> {
    if !applies(attrs) {
        return Ok(());
    }
    let pod = decode_pod(obj)?;
    berth_api::admission::validate_runtime_class(&pod, resolved.class.as_ref()).map_err(|why| forbidden(attrs, &why))
}

fn decode_class(value: Value) -> ApiResult<RuntimeClass> {
    serde_json::from_value(value).map_err(|e| ApiError::internal(e.to_string()))
}

async fn get_class(state: &ApiState, name: &str) -> ApiResult<Option<RuntimeClass>> {
    match state.store.get(&objects::key(&RUNTIMECLASSES, None, name)).await {
        Ok(Some(kv)) => Ok(Some(decode_class(objects::decode_kv(&RUNTIMECLASSES, &kv)?)?)),
        Ok(None) => Ok(None),
        Err(e) => Err(ApiError::from_store(e, &RUNTIMECLASSES, name)),
    }
}

async fn list_classes(state: &ApiState) -> ApiResult<Vec<RuntimeClass>> {
    let res = state
        .store
        .list(&objects::prefix(&RUNTIMECLASSES, None), &ListOptions::default())
        .await
        .map_err(|e| ApiError::from_store(e, &RUNTIMECLASSES, ""))?;
    res.items.iter().map(|kv| decode_class(objects::decode_kv(&RUNTIMECLASSES, kv)?)).collect()
}
