//! `TokenRequest` (authentication.k8s.io/v1), the `token` subresource of ServiceAccounts: a
//! signed, expiring token for the service account, optionally bound to a Pod or Secret so it
//! stops working once that object is gone (`kubectl create token`).
//!
//! A node may ask only for tokens bound to a pod scheduled on it, as NodeRestriction allows.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use berth_api::field_error::FieldError;
use berth_api::resources::{NODES, PODS, ResourceType, SECRETS, SERVICEACCOUNTS};
use http::{HeaderMap, Method, StatusCode};
use serde_json::{Value, json};

use crate::authz::{self, Identity};
use crate::satoken::{self, Claims, ObjectRef};
use crate::tokenreview::{GROUP, VERSION};
use crate::{ApiError, ApiResult, ApiState, objects, request};

/// `POST /api/v1/namespaces/{namespace}/serviceaccounts/{name}/token`.
pub async fn serve(
    State(state): State<Arc<ApiState>>,
    Path((namespace, name)): Path<(String, String)>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let result = async {
        if method != Method::POST {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({method} serviceaccounts token)"
            )));
        }
        let body = request::decode_body(&headers, &request::read_body(body).await?)?;
        let node = authz::with_request_user(|u| match u.map(authz::identity) {
            Some(Identity::Node(node)) => Some(node.to_string()),
            _ => None,
        });
        create(&state, &namespace, &name, body, node.as_deref(), jiff::Timestamp::now().as_second()).await
    }
    .await;
    let response = match result {
        Ok(created) => (StatusCode::CREATED, [(http::header::CONTENT_TYPE, "application/json")], created.to_string())
            .into_response(),
        Err(e) => e.into_response(),
    };
    state.metrics.observe_request("create", "serviceaccounts", response.status().as_u16(), started.elapsed());
    response
}

/// The stored object, if any.
async fn get(state: &ApiState, rt: &ResourceType, namespace: Option<&str>, name: &str) -> ApiResult<Option<Value>> {
    let kv =
        state.store.get(&objects::key(rt, namespace, name)).await.map_err(|e| ApiError::from_store(e, rt, name))?;
    kv.map(|kv| objects::decode_kv(rt, &kv)).transpose()
}

fn uid(obj: &Value) -> String {
    objects::meta_str(obj, "uid").unwrap_or_default().to_string()
}

/// Answers the TokenRequest `req` for ServiceAccount `namespace/name` at `now` (seconds);
/// `node` is the requesting node, if a node asks.
pub async fn create(
    state: &ApiState,
    namespace: &str,
    name: &str,
    mut req: Value,
    node: Option<&str>,
    now: i64,
) -> ApiResult<Value> {
    crate::request::check_type_meta(&mut req, &format!("{GROUP}/{VERSION}"), "TokenRequest")?;
    let Some(keys) = state.service_account_tokens.as_ref() else {
        return Err(ApiError::not_found(&SERVICEACCOUNTS, name));
    };
    let sa = get(state, &SERVICEACCOUNTS, Some(namespace), name)
        .await?
        .ok_or_else(|| ApiError::not_found(&SERVICEACCOUNTS, name))?;

    if !req.get("spec").is_some_and(Value::is_object) {
        req["spec"] = json!({});
    }
    let requested = match req.pointer("/spec/expirationSeconds") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_i64().ok_or_else(|| ApiError::bad_request("spec.expirationSeconds must be an integer"))?),
    };
    let seconds = satoken::expiration_seconds(requested).map_err(|(value, detail)| {
        let error = FieldError::invalid_raw("spec.expirationSeconds", value.to_string(), detail);
        ApiError::invalid_in_group(GROUP, "TokenRequest", &[error])
    })?;
    let audiences: Vec<String> = match req.pointer("/spec/audiences").and_then(Value::as_array) {
        Some(list) if !list.is_empty() => list.iter().filter_map(Value::as_str).map(String::from).collect(),
        _ => keys.api_audiences.clone(),
    };

    let sa_ref = ObjectRef { name: name.to_string(), uid: uid(&sa) };
    let mut claims = Claims::new(&keys.issuer, audiences.clone(), now, seconds, namespace, sa_ref);
    let bound = req.pointer("/spec/boundObjectRef").filter(|v| v.is_object()).cloned();
    if node.is_some() {
        authorize_node(name, bound.as_ref())?;
    }
    if let Some(bound) = &bound {
        bind(state, namespace, name, bound, node, &mut claims).await?;
    }

    let token = keys.sign(&claims);
    let expires = jiff::Timestamp::from_second(claims.expires_at).map_err(|e| ApiError::internal(e.to_string()))?;
    req["metadata"] = json!({"name": name, "namespace": namespace, "creationTimestamp": null});
    req["spec"]["audiences"] = json!(audiences);
    req["spec"]["expirationSeconds"] = json!(seconds);
    req["spec"]["boundObjectRef"] = bound.unwrap_or(Value::Null);
    req["status"] = json!({"token": token, "expirationTimestamp": berth_common::time::rfc3339(expires)});
    Ok(req)
}

/// NodeRestriction's rule for tokens: a node asks only for tokens bound to a pod.
fn authorize_node(name: &str, bound: Option<&Value>) -> ApiResult<()> {
    let kind = bound.and_then(|b| b.get("kind")).and_then(Value::as_str);
    if kind != Some("Pod") {
        return Err(ApiError::forbidden(&SERVICEACCOUNTS, name, "node requested token not bound to a pod"));
    }
    Ok(())
}

/// Binds the token to the object `bound` names, which must exist (with the given uid, if any).
async fn bind(
    state: &ApiState,
    namespace: &str,
    name: &str,
    bound: &Value,
    node: Option<&str>,
    claims: &mut Claims,
) -> ApiResult<()> {
    let field = |f: &str| bound.get(f).and_then(Value::as_str).unwrap_or_default().to_string();
    let (api_version, kind, object, want_uid) = (field("apiVersion"), field("kind"), field("name"), field("uid"));
    let record = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Pod") => {
            let pod = get(state, &PODS, Some(namespace), &object)
                .await?
                .ok_or_else(|| ApiError::not_found(&PODS, &object))?;
            let pod_sa = pod.pointer("/spec/serviceAccountName").and_then(Value::as_str).unwrap_or_default();
            if pod_sa != name {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token for serviceaccount {name:?} to pod running with different serviceaccount name."
                )));
            }
            let pod_node = pod.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or_default();
            if let Some(node) = node
                && pod_node != node
            {
                return Err(ApiError::forbidden(
                    &SERVICEACCOUNTS,
                    name,
                    "node requested token bound to a pod scheduled on a different node",
                ));
            }
            if !pod_node.is_empty()
                && let Some(node) = get(state, &NODES, None, pod_node).await?
            {
                claims.node = Some(ObjectRef { name: pod_node.to_string(), uid: uid(&node) });
            }
            let r = ObjectRef { name: object.clone(), uid: uid(&pod) };
            claims.pod = Some(r.clone());
            r
        }
        ("v1", "Secret") => {
            let secret = get(state, &SECRETS, Some(namespace), &object)
                .await?
                .ok_or_else(|| ApiError::not_found(&SECRETS, &object))?;
            let r = ObjectRef { name: object.clone(), uid: uid(&secret) };
            claims.secret = Some(r.clone());
            r
        }
        _ => {
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version.as_str()));
            return Err(ApiError::bad_request(format!(
                "cannot bind token to object of type {group}/{version}, Kind={kind}"
            )));
        }
    };
    if !want_uid.is_empty() && want_uid != record.uid {
        return Err(ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {kind} {object:?}: the UID in the bound object reference \
                 ({want_uid}) does not match the UID in record. The object might have been deleted and then recreated"
            ),
        ));
    }
    Ok(())
}
