//! Discovery and probes: `/version`, `/healthz`, `/readyz`, `/api`, `/apis` and per-group resource lists.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use berth_api::ResourceType;
use berth_api::resources::{self, ALL};
use serde_json::{Value, json};

use crate::{ApiError, ApiState};

pub async fn version() -> Json<Value> {
    Json(json!({
        "major": crate::KUBE_MAJOR,
        "minor": crate::KUBE_MINOR,
        "gitVersion": crate::KUBE_GIT_VERSION,
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "rust",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, go_arch()),
    }))
}

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The service account token keys; a server without them serves no OIDC discovery.
fn token_keys(state: &ApiState) -> Result<&crate::satoken::TokenKeys, ApiError> {
    state
        .service_account_tokens
        .as_ref()
        .ok_or_else(|| ApiError::new(404, "NotFound", "the server could not find the requested resource"))
}

/// OIDC discovery of the service account token issuer.
pub async fn openid_configuration(State(state): State<Arc<ApiState>>) -> Result<Json<Value>, ApiError> {
    Ok(Json(token_keys(&state)?.openid_configuration()))
}

/// The service account token verifying keys, as a JSON Web Key Set.
pub async fn openid_jwks(State(state): State<Arc<ApiState>>) -> Result<Json<Value>, ApiError> {
    Ok(Json(token_keys(&state)?.jwks()))
}

pub async fn healthz() -> &'static str {
    "ok"
}

/// Ready when the store answers; else 503 with the store's reason (e.g. etcd's `no leader`).
pub async fn readyz(State(state): State<Arc<ApiState>>) -> Result<&'static str, ApiError> {
    state.store.current_revision().await.map_err(|e| {
        let reason = std::error::Error::source(&e).map_or_else(|| e.to_string(), ToString::to_string);
        ApiError::unavailable(format!("storage ({}) is not ready: {reason}", state.store.backend()))
    })?;
    Ok("ok")
}

pub async fn api_versions() -> Json<Value> {
    Json(json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
    }))
}

fn group_json(group: &str, version: &str) -> Value {
    let gv = format!("{group}/{version}");
    json!({
        "name": group,
        "versions": [{"groupVersion": gv, "version": version}],
        "preferredVersion": {"groupVersion": gv, "version": version},
    })
}

/// The store's groups and the groups of resources served by their own handlers.
pub(crate) fn served_groups() -> Vec<(&'static str, &'static str)> {
    let mut groups = resources::groups();
    groups.push((crate::tokenreview::GROUP, crate::tokenreview::VERSION));
    groups.push((crate::accessreview::AUTHORIZATION_GROUP, crate::accessreview::AUTHORIZATION_VERSION));
    groups
}

pub async fn api_groups() -> Json<Value> {
    let groups: Vec<Value> =
        served_groups().into_iter().filter(|(g, _)| !g.is_empty()).map(|(g, v)| group_json(g, v)).collect();
    Json(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
}

pub async fn group(Path(group): Path<String>) -> Result<Json<Value>, ApiError> {
    let (g, v) = served_groups()
        .into_iter()
        .find(|(g, _)| !g.is_empty() && *g == group)
        .ok_or_else(|| ApiError::new(404, "NotFound", "the server could not find the requested resource"))?;
    let mut body = group_json(g, v);
    body["kind"] = json!("APIGroup");
    body["apiVersion"] = json!("v1");
    Ok(Json(body))
}

pub async fn core_resources() -> Json<Value> {
    Json(resource_list("", "v1"))
}

pub async fn group_resources(Path((group, version)): Path<(String, String)>) -> Result<Json<Value>, ApiError> {
    if !served_groups().iter().any(|(g, v)| !g.is_empty() && *g == group && *v == version) {
        return Err(ApiError::new(404, "NotFound", "the server could not find the requested resource"));
    }
    Ok(Json(resource_list(&group, &version)))
}

const ALL_VERBS: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

fn resource_entry(rt: &ResourceType) -> Value {
    let mut e = json!({
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": ALL_VERBS,
    });
    if !rt.short_names.is_empty() {
        e["shortNames"] = json!(rt.short_names);
    }
    if !rt.categories.is_empty() {
        e["categories"] = json!(rt.categories);
    }
    e
}

fn sub_entry(rt: &ResourceType, sub: &str, kind: &str, group: Option<(&str, &str)>, verbs: &[&str]) -> Value {
    let mut e = json!({
        "name": format!("{}/{sub}", rt.plural),
        "singularName": "",
        "namespaced": rt.namespaced,
        "kind": kind,
        "verbs": verbs,
    });
    if let Some((g, v)) = group {
        e["group"] = json!(g);
        e["version"] = json!(v);
    }
    e
}

pub(crate) fn resource_list(group: &str, version: &str) -> Value {
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    let mut out = Vec::new();
    for rt in ALL.iter().filter(|r| r.group == group && r.version == version) {
        out.push(resource_entry(rt));
        if rt.has_status {
            out.push(sub_entry(rt, "status", rt.kind, None, &["get", "patch", "update"]));
        }
        if rt.has_scale {
            out.push(sub_entry(rt, "scale", "Scale", Some(("autoscaling", "v1")), &["get", "patch", "update"]));
        }
        if rt.kind == "Pod" {
            out.push(sub_entry(rt, "binding", "Binding", None, &["create"]));
            out.push(sub_entry(rt, "log", "Pod", None, &["get"]));
            for (sub, kind) in
                [("exec", "PodExecOptions"), ("attach", "PodAttachOptions"), ("portforward", "PodPortForwardOptions")]
            {
                out.push(sub_entry(rt, sub, kind, None, &["create", "get"]));
            }
        }
        if rt.kind == "Namespace" {
            out.push(sub_entry(rt, "finalize", rt.kind, None, &["update"]));
        }
        if rt.kind == "ServiceAccount" {
            let group = Some((crate::tokenreview::GROUP, crate::tokenreview::VERSION));
            out.push(sub_entry(rt, "token", "TokenRequest", group, &["create"]));
        }
    }
    if (group, version) == (crate::tokenreview::GROUP, crate::tokenreview::VERSION) {
        out.extend(crate::tokenreview::api_resources());
        out.extend(crate::accessreview::authentication_resources());
    }
    if (group, version) == (crate::accessreview::AUTHORIZATION_GROUP, crate::accessreview::AUTHORIZATION_VERSION) {
        out.extend(crate::accessreview::authorization_resources());
    }
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_list_has_pod_subresources_and_short_names() {
        let list = resource_list("", "v1");
        let names: Vec<&str> =
            list["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert!(names.contains(&"pods/status") && names.contains(&"pods/binding"));
        assert!(!names.contains(&"runtimeclasses"));
        let pods = list["resources"].as_array().unwrap().iter().find(|r| r["name"] == "pods").unwrap();
        assert_eq!(pods["shortNames"], json!(["po"]));
    }
}
