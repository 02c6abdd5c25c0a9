//! The reviews a client asks about itself or another subject, create only and never stored:
//! `SelfSubjectAccessReview`, `SubjectAccessReview` and `SelfSubjectRulesReview`
//! (authorization.k8s.io/v1) answered by the server's own authorizer ([`crate::authz`]), and
//! `SelfSubjectReview` (authentication.k8s.io/v1) answered from the authenticated user.
//! `kubectl auth can-i [--list]` and `kubectl auth whoami` use them.
//!
//! The rules of a rules review are the authorizer's own answers: every served resource and
//! subresource is put to it with each verb discovery lists for it, so the rules cannot drift from
//! what requests are allowed. Permissions on single named objects (a node's referenced secrets,
//! its own Lease) are not found that way: a node's review says it is incomplete.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use berth_api::FieldError;
use http::{HeaderMap, Method, StatusCode};
use serde_json::{Value, json};

use crate::authn::UserInfo;
use crate::authz::{self, Decision, Request, ResourceRequest};
use crate::{ApiError, ApiResult, ApiState, request};

pub const AUTHORIZATION_GROUP: &str = "authorization.k8s.io";
pub const AUTHORIZATION_VERSION: &str = "v1";

/// The reviews served here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Review {
    SelfSubjectAccess,
    SubjectAccess,
    /// A `SubjectAccessReview` posted in a namespace, about that namespace only.
    LocalSubjectAccess,
    SelfSubjectRules,
    SelfSubject,
}

impl Review {
    fn kind(self) -> &'static str {
        match self {
            Review::SelfSubjectAccess => "SelfSubjectAccessReview",
            Review::SubjectAccess => "SubjectAccessReview",
            Review::LocalSubjectAccess => "LocalSubjectAccessReview",
            Review::SelfSubjectRules => "SelfSubjectRulesReview",
            Review::SelfSubject => "SelfSubjectReview",
        }
    }

    fn group(self) -> &'static str {
        match self {
            Review::SelfSubjectAccess
            | Review::SubjectAccess
            | Review::LocalSubjectAccess
            | Review::SelfSubjectRules => AUTHORIZATION_GROUP,
            Review::SelfSubject => crate::tokenreview::GROUP,
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Review::SelfSubjectAccess => "selfsubjectaccessreviews",
            Review::SubjectAccess => "subjectaccessreviews",
            Review::LocalSubjectAccess => "localsubjectaccessreviews",
            Review::SelfSubjectRules => "selfsubjectrulesreviews",
            Review::SelfSubject => "selfsubjectreviews",
        }
    }

    fn api_resource(self) -> Value {
        json!({
            "name": self.plural(),
            "singularName": self.kind().to_ascii_lowercase(),
            "namespaced": self == Review::LocalSubjectAccess,
            "kind": self.kind(),
            "verbs": ["create"],
        })
    }
}

/// The entries of `/apis/authorization.k8s.io/v1`.
pub fn authorization_resources() -> Vec<Value> {
    vec![
        Review::LocalSubjectAccess.api_resource(),
        Review::SelfSubjectAccess.api_resource(),
        Review::SelfSubjectRules.api_resource(),
        Review::SubjectAccess.api_resource(),
    ]
}

/// The entries this module adds to `/apis/authentication.k8s.io/v1`.
pub fn authentication_resources() -> Vec<Value> {
    vec![Review::SelfSubject.api_resource()]
}

/// `/apis/authorization.k8s.io/v1/selfsubjectaccessreviews`
pub async fn self_subject_access(state: State<Arc<ApiState>>, m: Method, h: HeaderMap, b: Body) -> Response {
    serve(state, Review::SelfSubjectAccess, None, m, h, b).await
}

/// `/apis/authorization.k8s.io/v1/subjectaccessreviews`
pub async fn subject_access(state: State<Arc<ApiState>>, m: Method, h: HeaderMap, b: Body) -> Response {
    serve(state, Review::SubjectAccess, None, m, h, b).await
}

/// `/apis/authorization.k8s.io/v1/namespaces/{namespace}/localsubjectaccessreviews`
pub async fn local_subject_access(
    state: State<Arc<ApiState>>,
    Path(namespace): Path<String>,
    m: Method,
    h: HeaderMap,
    b: Body,
) -> Response {
    serve(state, Review::LocalSubjectAccess, Some(namespace), m, h, b).await
}

/// `/apis/authorization.k8s.io/v1/selfsubjectrulesreviews`
pub async fn self_subject_rules(state: State<Arc<ApiState>>, m: Method, h: HeaderMap, b: Body) -> Response {
    serve(state, Review::SelfSubjectRules, None, m, h, b).await
}

/// `/apis/authentication.k8s.io/v1/selfsubjectreviews`
pub async fn self_subject(state: State<Arc<ApiState>>, m: Method, h: HeaderMap, b: Body) -> Response {
    serve(state, Review::SelfSubject, None, m, h, b).await
}

async fn serve(
    State(state): State<Arc<ApiState>>,
    review: Review,
    namespace: Option<String>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let result = async {
        if method != Method::POST {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({method} {})",
                review.plural()
            )));
        }
        // A review is not an object kept in the API: it has no metadata to show as a Table.
        let shape = match request::output(&headers) {
            request::Output::Object => None,
            request::Output::Table => Some("a Table"),
            request::Output::PartialMetadata => Some("PartialObjectMetadata"),
        };
        if let Some(shape) = shape {
            return Err(ApiError::not_acceptable(format!(
                "the resource {} does not support being converted to {shape}",
                review.plural()
            )));
        }
        let mut body = request::decode_body(&headers, &request::read_body(body).await?)?;
        if let Some(namespace) = &namespace {
            in_namespace(&mut body, namespace)?;
        }
        // Without an authenticator (in-process tests) every request is served as an admin.
        let user = authz::with_request_user(|u| u.cloned());
        answer(&state, review, user.as_ref(), body).await
    }
    .await;
    let response = match result {
        Ok(answered) => (StatusCode::CREATED, [(http::header::CONTENT_TYPE, "application/json")], answered.to_string())
            .into_response(),
        Err(e) => e.into_response(),
    };
    state.metrics.observe_request("create", review.plural(), response.status().as_u16(), started.elapsed());
    response
}

async fn answer(state: &ApiState, review: Review, user: Option<&UserInfo>, mut body: Value) -> ApiResult<Value> {
    check_type(review, &mut body)?;
    match review {
        Review::SelfSubject => {
            body["status"] = json!({"userInfo": user.map(user_info).unwrap_or_else(|| json!({}))});
        }
        Review::SelfSubjectAccess => {
            let request = attributes(review, &body)?;
            let decision = match user {
                Some(user) => authz::decide(state, user, &request).await?,
                None => Decision::Allow,
            };
            body["status"] = status(decision);
        }
        Review::SubjectAccess | Review::LocalSubjectAccess => {
            let request = attributes(review, &body)?;
            let subject = subject(&body);
            body["status"] = status(authz::decide(state, &subject, &request).await?);
        }
        Review::SelfSubjectRules => {
            let namespace = body.pointer("/spec/namespace").and_then(Value::as_str).unwrap_or_default();
            body["status"] = match user {
                Some(user) if authz::identity(user) != authz::Identity::Master => rules(user, namespace),
                _ => json!({
                    "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                    "incomplete": false,
                }),
            };
        }
    }
    Ok(body)
}

/// The non-resource paths a rules review puts to the authorizer.
const NON_RESOURCE_PATHS: &[&str] = &[
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/livez",
    "/metrics",
    "/openapi",
    "/openapi/*",
    "/readyz",
    "/version",
];
const NON_RESOURCE_VERBS: &[&str] = &["get", "post", "put", "patch", "delete"];

/// `SubjectRulesReviewStatus` of `user` in `namespace`, from the authorizer's answers (see the
/// module doc).
fn rules(user: &UserInfo, namespace: &str) -> Value {
    // No pod references any object here: named permissions are left out.
    let nothing = |_: authz::Referenced, _: &str, _: &str| false;
    let mut resource_rules = Vec::new();
    for (group, version) in crate::discovery::served_groups() {
        let list = crate::discovery::resource_list(group, version);
        for entry in list["resources"].as_array().into_iter().flatten() {
            let name = entry["name"].as_str().unwrap_or_default();
            let (resource, subresource) = name.split_once('/').unwrap_or((name, ""));
            let scope = if entry["namespaced"] == true { namespace } else { "" };
            let verbs: Vec<&str> = entry["verbs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .filter(|verb| {
                    let request = Request::Resource(ResourceRequest {
                        verb: verb.to_string(),
                        group: group.to_string(),
                        version: version.to_string(),
                        resource: resource.to_string(),
                        subresource: subresource.to_string(),
                        namespace: scope.to_string(),
                        name: String::new(),
                    });
                    authz::authorize(user, &request, &nothing) == Decision::Allow
                })
                .collect();
            if !verbs.is_empty() {
                resource_rules.push(json!({"verbs": verbs, "apiGroups": [group], "resources": [name]}));
            }
        }
    }
    let mut non_resource_rules = Vec::new();
    for path in NON_RESOURCE_PATHS {
        let verbs: Vec<&str> = NON_RESOURCE_VERBS
            .iter()
            .copied()
            .filter(|verb| {
                let request = Request::NonResource { verb: verb.to_string(), path: path.to_string() };
                authz::authorize(user, &request, &nothing) == Decision::Allow
            })
            .collect();
        if !verbs.is_empty() {
            non_resource_rules.push(json!({"verbs": verbs, "nonResourceURLs": [path]}));
        }
    }
    let incomplete = matches!(authz::identity(user), authz::Identity::Node(_));
    json!({"resourceRules": resource_rules, "nonResourceRules": non_resource_rules, "incomplete": incomplete})
}

/// A local review belongs to the namespace it is posted in: its `metadata.namespace` is that one
/// (filled in when absent), as kube-apiserver requires.
fn in_namespace(body: &mut Value, namespace: &str) -> ApiResult<()> {
    match body.pointer("/metadata/namespace").and_then(Value::as_str) {
        None | Some("") => {
            if !body.get("metadata").is_some_and(Value::is_object) {
                body["metadata"] = json!({});
            }
            body["metadata"]["namespace"] = json!(namespace);
            Ok(())
        }
        Some(ns) if ns == namespace => Ok(()),
        Some(_) => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
    }
}

/// Checks `apiVersion` and `kind` (filled in when absent) and gives the review its metadata.
fn check_type(review: Review, body: &mut Value) -> ApiResult<()> {
    request::check_type_meta(body, &format!("{}/v1", review.group()), review.kind())?;
    if !body.get("metadata").is_some_and(Value::is_object) {
        body["metadata"] = json!({});
    }
    Ok(())
}

fn user_info(user: &UserInfo) -> Value {
    let mut info = json!({"username": user.name, "groups": user.groups});
    if !user.uid.is_empty() {
        info["uid"] = json!(user.uid);
    }
    if !user.extra.is_empty() {
        info["extra"] = json!(user.extra);
    }
    info
}

fn str_field<'a>(obj: &'a Value, key: &str) -> &'a str {
    obj.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// The request the review asks about: exactly one of `resourceAttributes` and
/// `nonResourceAttributes`, as Kubernetes' validation of the spec requires.
fn attributes(review: Review, body: &Value) -> ApiResult<Request> {
    let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    let resource = spec.get("resourceAttributes").filter(|v| !v.is_null());
    let non_resource = spec.get("nonResourceAttributes").filter(|v| !v.is_null());
    let mut errors = Vec::new();
    match (resource, non_resource) {
        (Some(_), Some(n)) => errors.push(FieldError::invalid_raw(
            "spec.nonResourceAttributes",
            format!(
                "authorization.NonResourceAttributes{{Path:{:?}, Verb:{:?}}}",
                str_field(n, "path"),
                str_field(n, "verb")
            ),
            "cannot be specified in combination with resourceAttributes",
        )),
        (None, None) => errors.push(FieldError::invalid(
            "spec.resourceAttributes",
            "null",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )),
        _ => {}
    }
    if review == Review::LocalSubjectAccess
        && let Some(r) = resource
    {
        let namespace = body.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default();
        if str_field(r, "namespace") != namespace {
            errors.push(FieldError::invalid(
                "spec.resourceAttributes.namespace",
                str_field(r, "namespace"),
                "must match metadata.namespace",
            ));
        }
    }
    if matches!(review, Review::SubjectAccess | Review::LocalSubjectAccess)
        && str_field(&spec, "user").is_empty()
        && spec.get("groups").and_then(Value::as_array).is_none_or(Vec::is_empty)
    {
        errors.push(FieldError::invalid("spec.user", "", "at least one of user or group must be specified"));
    }
    if !errors.is_empty() {
        return Err(ApiError::invalid_in_group(review.group(), review.kind(), &errors));
    }
    Ok(match (resource, non_resource) {
        (Some(r), _) => Request::Resource(ResourceRequest {
            verb: str_field(r, "verb").to_string(),
            group: str_field(r, "group").to_string(),
            version: str_field(r, "version").to_string(),
            resource: str_field(r, "resource").to_string(),
            subresource: str_field(r, "subresource").to_string(),
            namespace: str_field(r, "namespace").to_string(),
            name: str_field(r, "name").to_string(),
        }),
        (None, n) => {
            let n = n.cloned().unwrap_or_default();
            Request::NonResource { verb: str_field(&n, "verb").to_string(), path: str_field(&n, "path").to_string() }
        }
    })
}

/// The subject of a `SubjectAccessReview`: the user and groups as given (no group is implied).
fn subject(body: &Value) -> UserInfo {
    let spec = body.get("spec").cloned().unwrap_or_default();
    let groups = spec.get("groups").and_then(Value::as_array).cloned().unwrap_or_default();
    UserInfo {
        name: str_field(&spec, "user").to_string(),
        uid: str_field(&spec, "uid").to_string(),
        groups: groups.iter().filter_map(Value::as_str).map(str::to_string).collect(),
        ..Default::default()
    }
}

/// `SubjectAccessReviewStatus`: berth's authorizers have no explicit deny, so a request they do
/// not allow is "no opinion" (`allowed: false`, `denied` unset) with the authorizer's reason.
fn status(decision: Decision) -> Value {
    match decision {
        Decision::Allow => json!({"allowed": true}),
        Decision::Deny(reason) if reason.is_empty() => json!({"allowed": false}),
        Decision::Deny(reason) => json!({"allowed": false, "reason": reason}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_review_names_exactly_one_kind_of_attributes() {
        let neither = json!({"spec": {}});
        let e = attributes(Review::SelfSubjectAccess, &neither).unwrap_err();
        assert_eq!((e.code, e.reason), (422, "Invalid"));
        assert_eq!(
            e.message,
            "SelfSubjectAccessReview.authorization.k8s.io \"\" is invalid: spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified"
        );
        let both = json!({"spec": {"resourceAttributes": {"verb": "get"}, "nonResourceAttributes": {"path": "/x", "verb": "get"}}});
        let e = attributes(Review::SelfSubjectAccess, &both).unwrap_err();
        assert!(e.message.contains("spec.nonResourceAttributes: Invalid value:"), "{}", e.message);
        assert!(e.message.ends_with("cannot be specified in combination with resourceAttributes"), "{}", e.message);
    }

    #[test]
    fn a_subject_access_review_names_a_user_or_a_group() {
        let body = json!({"spec": {"resourceAttributes": {"verb": "get", "resource": "pods"}}});
        let e = attributes(Review::SubjectAccess, &body).unwrap_err();
        assert!(
            e.message.ends_with("spec.user: Invalid value: \"\": at least one of user or group must be specified"),
            "{}",
            e.message
        );
        let with_group = json!({"spec": {"resourceAttributes": {"verb": "get"}, "groups": ["system:nodes"]}});
        assert!(attributes(Review::SubjectAccess, &with_group).is_ok());
    }

    #[test]
    fn resource_attributes_become_the_request_the_authorizer_judges() {
        let body = json!({"spec": {"resourceAttributes": {"namespace": "d", "verb": "get", "group": "", "resource": "secrets", "name": "s"}}});
        let Request::Resource(r) = attributes(Review::SelfSubjectAccess, &body).unwrap() else {
            panic!("a resource request")
        };
        assert_eq!(
            (r.verb.as_str(), r.resource.as_str(), r.namespace.as_str(), r.name.as_str()),
            ("get", "secrets", "d", "s")
        );
        let body = json!({"spec": {"nonResourceAttributes": {"path": "/healthz", "verb": "get"}}});
        assert_eq!(
            attributes(Review::SelfSubjectAccess, &body).unwrap(),
            Request::NonResource { verb: "get".into(), path: "/healthz".into() }
        );
    }
}
