//! DefaultTolerationSeconds: pods that do not tolerate the `node.kubernetes.io/not-ready` and
//! `node.kubernetes.io/unreachable` NoExecute taints get tolerations for them with a limit
//! (300 s by default), so their node's controller evicts them only after it, as Kubernetes'
//! plugin of that name; the decision is `berth_api::admission::DefaultTolerationSeconds`.

use berth_api::admission::DefaultTolerationSeconds;
use berth_api::resources::PODS;
use k8s_openapi::api::core::v1::Toleration;
use serde_json::{Value, json};

use super::Attributes;
use crate::{ApiError, ApiResult};

/// Appends the missing tolerations to the pod `obj` (main resource only, create and update).
pub fn admit(config: &DefaultTolerationSeconds, attrs: &Attributes<'_>, obj: &mut Value) -> ApiResult<()> {
    if !std::ptr::eq(attrs.target.rt, &PODS) || attrs.target.subresource.is_some() {
        return Ok(());
    }
    let Some(pod) = obj.as_object_mut() else {
        return Err(ApiError::bad_request("expected a Pod object"));
    };
    let spec = pod.entry("spec").or_insert_with(|| json!({}));
    let Some(spec) = spec.as_object_mut() else {
        return Err(ApiError::bad_request("expected a Pod object"));
    };
    let tolerations: Vec<Toleration> = match spec.get("tolerations") {
        None | Some(Value::Null) => Vec::new(),
        Some(list) => serde_json::from_value(list.clone()).map_err(|e| ApiError::bad_request(e.to_string()))?,
    };
    let missing = config.missing(&tolerations);
    if missing.is_empty() {
        return Ok(());
    }
    let mut added = Vec::with_capacity(missing.len());
    for toleration in &missing {
        added.push(serde_json::to_value(toleration).map_err(|e| ApiError::internal(e.to_string()))?);
    }
    match spec.get_mut("tolerations") {
        Some(Value::Array(list)) => list.extend(added),
        _ => {
            spec.insert("tolerations".into(), Value::Array(added));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::Operation;
    use crate::request::Target;

    fn attrs<'a>(t: &'a Target) -> Attributes<'a> {
        Attributes { target: t, name: "p", operation: Operation::Create, old: None }
    }

    #[test]
    fn the_tolerations_are_appended_after_the_pods_own() {
        let t = Target { rt: &PODS, namespace: Some("default".into()), name: None, subresource: None };
        let mut pod =
            json!({"metadata": {"name": "p"}, "spec": {"tolerations": [{"key": "gpu", "operator": "Exists"}]}});
        admit(&DefaultTolerationSeconds { not_ready: 30, unreachable: 60 }, &attrs(&t), &mut pod).unwrap();
        assert_eq!(
            pod["spec"]["tolerations"],
            json!([
                {"key": "gpu", "operator": "Exists"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}
            ])
        );
    }

    #[test]
    fn subresources_and_other_kinds_are_left_alone() {
        let status = Target { rt: &PODS, namespace: None, name: Some("p".into()), subresource: Some("status".into()) };
        let mut pod = json!({"spec": {}});
        admit(&DefaultTolerationSeconds::default(), &attrs(&status), &mut pod).unwrap();
        assert_eq!(pod, json!({"spec": {}}));
        let cm = Target { rt: &berth_api::resources::CONFIGMAPS, namespace: None, name: None, subresource: None };
        let mut obj = json!({"data": {}});
        admit(&DefaultTolerationSeconds::default(), &attrs(&cm), &mut obj).unwrap();
        assert_eq!(obj, json!({"data": {}}));
    }
}
