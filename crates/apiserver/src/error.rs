//! API errors and their one conversion to the wire: a `metav1.Status` with Kubernetes' code and reason.

use axum::response::{IntoResponse, Response};
use berth_api::{FieldError, ResourceType};
use berth_store::StoreError;
use http::StatusCode;
use serde_json::{Value, json};

/// An error answered to a client. `reason` and `code` are Kubernetes' `StatusReason` and HTTP code.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

fn details(rt: &ResourceType, name: &str) -> Value {
    let mut d = json!({ "name": name, "kind": rt.plural });
    if !rt.group.is_empty() {
        d["group"] = json!(rt.group);
    }
    d
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self { code, reason, message: message.into(), details: None }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }
    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        Self {
            details: Some(details(rt, name)),
            ..Self::new(404, "NotFound", format!("{} {name:?} not found", rt.qualified_plural()))
        }
    }
    pub fn namespace_not_found(ns: &str) -> Self {
        Self {
            details: Some(json!({"name": ns, "kind": "namespaces"})),
            ..Self::new(404, "NotFound", format!("namespaces {ns:?} not found"))
        }
    }
    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        Self {
            details: Some(details(rt, name)),
            ..Self::new(409, "AlreadyExists", format!("{} {name:?} already exists", rt.qualified_plural()))
        }
    }
    pub fn conflict(rt: &ResourceType, name: &str) -> Self {
        Self::conflict_with(
            rt,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }
    pub fn conflict_with(rt: &ResourceType, name: &str, why: &str) -> Self {
        Self {
            details: Some(details(rt, name)),
            ..Self::new(
                409,
                "Conflict",
                format!("Operation cannot be fulfilled on {} {name:?}: {why}", rt.qualified_plural()),
            )
        }
    }
    /// 403 in the form admission and namespace lifecycle use: `pods "x" is forbidden: <why>`.
    pub fn forbidden(rt: &ResourceType, name: &str, why: &str) -> Self {
        Self {
            details: Some(details(rt, name)),
            ..Self::new(403, "Forbidden", format!("{} {name:?} is forbidden: {why}", rt.qualified_plural()))
        }
    }
    pub fn invalid(rt: &ResourceType, name: &str, errors: &[FieldError]) -> Self {
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| {
                let full = e.to_string();
                let msg = full.strip_prefix(&format!("{}: ", e.field)).unwrap_or(&full).to_string();
                json!({"reason": e.error_type.reason(), "message": msg, "field": e.field})
            })
            .collect();
        let mut d = details(rt, name);
        d["kind"] = json!(rt.kind);
        d["causes"] = json!(causes);
        Self {
            details: Some(d),
            ..Self::new(422, "Invalid", berth_api::field_error::invalid_message(rt.kind, name, errors))
        }
    }
    /// 422 for invalid request options of `meta.k8s.io` (`DeleteOptions`, ...), as Kubernetes
    /// words it: `DeleteOptions.meta.k8s.io "" is invalid: <errors>`.
    pub fn invalid_options(kind: &str, errors: &[FieldError]) -> Self {
        Self::invalid_in_group("meta.k8s.io", kind, errors)
    }
    /// 422 for an invalid object that has no name and is not stored (reviews, options):
    /// `<Kind>.<group> "" is invalid: <errors>`.
    pub fn invalid_in_group(group: &str, kind: &str, errors: &[FieldError]) -> Self {
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| {
                let full = e.to_string();
                let msg = full.strip_prefix(&format!("{}: ", e.field)).unwrap_or(&full).to_string();
                json!({"reason": e.error_type.reason(), "message": msg, "field": e.field})
            })
            .collect();
        let qualified = format!("{kind}.{group}");
        Self {
            details: Some(json!({"group": group, "kind": kind, "causes": causes})),
            ..Self::new(422, "Invalid", berth_api::field_error::invalid_message(&qualified, "", errors))
        }
    }
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }
    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }
    pub fn too_large() -> Self {
        Self::new(413, "RequestEntityTooLarge", format!("Request entity too large: limit is {}", crate::MAX_BODY_BYTES))
    }
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {content_type:?})"
            ),
        )
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }

    /// Maps a store error on object `name` of `rt` to what Kubernetes answers.
    pub fn from_store(err: StoreError, rt: &ResourceType, name: &str) -> Self {
        match err {
            StoreError::NotFound { .. } => Self::not_found(rt, name),
            StoreError::AlreadyExists { .. } => Self::already_exists(rt, name),
            StoreError::Conflict { .. } => Self::conflict(rt, name),
            StoreError::Compacted { requested, compacted } => {
                Self::gone(format!("too old resource version: {requested} ({compacted})"))
            }
            StoreError::Invalid(m) => Self::bad_request(m),
            StoreError::Unavailable(e) => {
                tracing::warn!(error = %e, "store unavailable");
                Self::unavailable(format!("storage is unavailable: {e}"))
            }
            StoreError::Internal(e) => {
                tracing::error!(error = %e, "store internal error");
                Self::internal(format!("storage error: {e}"))
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (code, [(http::header::CONTENT_TYPE, "application/json")], self.to_status().to_string()).into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
