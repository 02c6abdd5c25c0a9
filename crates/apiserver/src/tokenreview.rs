//! `TokenReview` (authentication.k8s.io/v1, create only): who a bearer token belongs to, answered
//! by the server's own authenticator. Node agents use it to authenticate callers of their API.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, Method, StatusCode};
use serde_json::{Value, json};

use crate::authn::TokenAuthenticator;
use crate::{ApiError, ApiResult, ApiState, request, satoken};

pub const GROUP: &str = "authentication.k8s.io";
pub const VERSION: &str = "v1";
/// The audiences the server's tokens are good for: Kubernetes' default API audience. Static and
/// node tokens carry no audience of their own, so a review asking for others fails.
pub const API_AUDIENCES: &[&str] = &["https://kubernetes.default.svc.cluster.local"];

/// The group's entry in `/apis/authentication.k8s.io/v1`.
pub fn api_resources() -> Vec<Value> {
    vec![json!({
        "name": "tokenreviews",
        "singularName": "tokenreview",
        "namespaced": false,
        "kind": "TokenReview",
        "verbs": ["create"],
    })]
}

/// `/apis/authentication.k8s.io/v1/tokenreviews`: POST only.
pub async fn serve(State(state): State<Arc<ApiState>>, method: Method, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let result = async {
        if method != Method::POST {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({method} tokenreviews)"
            )));
        }
        let body = request::decode_body(&headers, &request::read_body(body).await?)?;
        let reviewed = review(state.authenticator.as_ref(), body)?;
        if state.authenticator.is_some() && reviewed.pointer("/status/authenticated") == Some(&json!(false)) {
            return Ok(review_service_account_token(&state, reviewed).await);
        }
        Ok(reviewed)
    }
    .await;
    let response = match result {
        Ok(reviewed) => (StatusCode::CREATED, [(http::header::CONTENT_TYPE, "application/json")], reviewed.to_string())
            .into_response(),
        Err(e) => e.into_response(),
    };
    state.metrics.observe_request("create", "tokenreviews", response.status().as_u16(), started.elapsed());
    response
}

/// Fills in `status` of a TokenReview as kube-apiserver does. Without an authenticator (the
/// in-process test mode) the review comes back as sent.
pub fn review(authn: Option<&TokenAuthenticator>, mut review: Value) -> ApiResult<Value> {
    crate::request::check_type_meta(&mut review, &format!("{GROUP}/{VERSION}"), "TokenReview")?;
    if !review.get("metadata").is_some_and(Value::is_object) {
        review["metadata"] = json!({});
    }
    let token = review.pointer("/spec/token").and_then(Value::as_str).unwrap_or_default().to_string();
    if token.is_empty() {
        return Err(ApiError::bad_request("token is required for TokenReview in authentication"));
    }
    let Some(authn) = authn else {
        return Ok(review);
    };
    let requested: Vec<String> = match review.pointer("/spec/audiences").and_then(Value::as_array) {
        Some(list) if !list.is_empty() => list.iter().filter_map(Value::as_str).map(String::from).collect(),
        _ => API_AUDIENCES.iter().map(|a| a.to_string()).collect(),
    };
    let audiences: Vec<&str> = API_AUDIENCES.iter().copied().filter(|a| requested.iter().any(|r| r == a)).collect();
    let user = if audiences.is_empty() { None } else { authn.authenticate_token(&token) };
    review["status"] = match user {
        Some(user) => {
            let mut info = json!({"username": user.name, "groups": user.groups});
            if !user.uid.is_empty() {
                info["uid"] = json!(user.uid);
            }
            json!({"authenticated": true, "user": info, "audiences": audiences})
        }
        None => json!({"authenticated": false, "user": {}, "error": "invalid bearer token"}),
    };
    Ok(review)
}

/// Reviews the token of an unauthenticated review again as a service account token: good for
/// the requested audiences (the API's by default) that it names.
async fn review_service_account_token(state: &ApiState, mut review: Value) -> Value {
    let Some(keys) = state.service_account_tokens.as_ref() else { return review };
    let token = review.pointer("/spec/token").and_then(Value::as_str).unwrap_or_default();
    let requested: Vec<String> = match review.pointer("/spec/audiences").and_then(Value::as_array) {
        Some(list) if !list.is_empty() => list.iter().filter_map(Value::as_str).map(String::from).collect(),
        _ => keys.api_audiences.clone(),
    };
    let Some(claims) = keys.verify(token, &requested, jiff::Timestamp::now().as_second()) else { return review };
    if !satoken::verify_objects(state, &claims).await {
        return review;
    }
    let user = claims.user();
    let info = json!({"username": user.name, "uid": user.uid, "groups": user.groups, "extra": user.extra});
    let audiences: Vec<&String> = requested.iter().filter(|a| claims.audiences.contains(a)).collect();
    review["status"] = json!({"authenticated": true, "user": info, "audiences": audiences});
    review
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authn() -> TokenAuthenticator {
        TokenAuthenticator::new("admintoken".into())
    }

    #[test]
    fn a_known_token_is_reviewed_as_its_user() {
        let out = review(Some(&authn()), json!({"spec": {"token": "admintoken"}})).unwrap();
        assert_eq!(out["apiVersion"], "authentication.k8s.io/v1");
        assert_eq!(out["kind"], "TokenReview");
        assert_eq!(
            out["status"],
            json!({
                "authenticated": true,
                "user": {"username": "admin", "groups": ["system:masters", "system:authenticated"]},
                "audiences": ["https://kubernetes.default.svc.cluster.local"],
            })
        );
    }

    #[test]
    fn an_unknown_token_or_a_foreign_audience_is_not_authenticated() {
        for spec in [json!({"token": "nope"}), json!({"token": "admintoken", "audiences": ["vault"]})] {
            let out = review(Some(&authn()), json!({"spec": spec})).unwrap();
            assert_eq!(out["status"]["authenticated"], false, "{spec}");
            assert_eq!(out["status"]["error"], "invalid bearer token");
        }
    }

    #[test]
    fn a_review_without_a_token_or_of_another_kind_is_a_bad_request() {
        let err = review(Some(&authn()), json!({"spec": {}})).unwrap_err();
        assert_eq!((err.code, err.message.as_str()), (400, "token is required for TokenReview in authentication"));
        let err = review(Some(&authn()), json!({"kind": "Pod", "spec": {"token": "x"}})).unwrap_err();
        assert_eq!(err.code, 400);
    }
}
