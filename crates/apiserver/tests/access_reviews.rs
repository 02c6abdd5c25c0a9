//! Access reviews through the whole router: who am I (`SelfSubjectReview`), may I
//! (`SelfSubjectAccessReview`) and may they (`SubjectAccessReview`), answered by the same
//! authenticator and authorizer that guard every request, and listed in discovery.

use std::sync::Arc;

use axum::body::Body;
use berth_apiserver::authn::{NODE_TOKEN_FILE, TokenAuthenticator, create_node_token};
use berth_apiserver::{ApiState, lifecycle, protobuf, router};
use berth_store::sqlite::SqliteStore;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const ADMIN: &str = "admin-token-0123456789";
const ALICE: &str = "alice-token-0123456789";
const SSAR: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
const SAR: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
const SSR: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
const SSRR: &str = "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews";

struct Api {
    state: Arc<ApiState>,
    _dir: tempfile::TempDir,
    node: String,
}

impl Api {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
        let users = dir.path().join("users.csv");
        std::fs::write(&users, format!("{ALICE},alice,uid-alice,dev\n")).unwrap();
        let mut authn = TokenAuthenticator::new(ADMIN.into());
        authn.load_token_file(&users).unwrap();
        authn.watch_token_file(&dir.path().join(NODE_TOKEN_FILE)).unwrap();
        let state = ApiState::new(Arc::new(store), Some(authn));
        lifecycle::bootstrap(&state).await.unwrap();
        let node = create_node_token(dir.path(), "node-a").unwrap();
        Api { state, _dir: dir, node }
    }

    async fn send(&self, token: &str, method: &str, path: &str, body: Option<&Value>) -> (StatusCode, Value) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {token}"));
        let body = body.map(|b| Body::from(b.to_string())).unwrap_or_else(Body::empty);
        let resp = router(self.state.clone()).oneshot(req.body(body).unwrap()).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// `status` of a SelfSubjectAccessReview of `attributes` by the owner of `token`.
    async fn may_i(&self, token: &str, attributes: Value) -> Value {
        let review =
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": attributes});
        let (code, body) = self.send(token, "POST", SSAR, Some(&review)).await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
        body["status"].clone()
    }
}

fn resource(verb: &str, resource: &str, namespace: &str) -> Value {
    json!({"resourceAttributes": {"verb": verb, "resource": resource, "namespace": namespace}})
}

#[tokio::test]
async fn an_admin_may_create_pods_and_a_node_may_not_create_deployments() {
    let api = Api::new().await;
    assert_eq!(api.may_i(ADMIN, resource("create", "pods", "default")).await, json!({"allowed": true}));
    assert_eq!(api.may_i(ALICE, resource("delete", "namespaces", "")).await, json!({"allowed": true}));
    let node = api.node.clone();
    assert_eq!(api.may_i(&node, resource("get", "pods", "default")).await["allowed"], true);
    let deployments = json!({"resourceAttributes": {"verb": "create", "group": "apps", "resource": "deployments", "namespace": "default"}});
    let status = api.may_i(&node, deployments).await;
    assert_eq!(status["allowed"], false, "{status}");
    assert!(status.get("denied").is_none(), "the Node authorizer has no opinion, it does not deny: {status}");
    // The node reads only secrets its pods reference, and the review says why.
    let secret =
        json!({"resourceAttributes": {"verb": "get", "resource": "secrets", "namespace": "default", "name": "s"}});
    assert_eq!(
        api.may_i(&node, secret).await,
        json!({"allowed": false, "reason": "no relationship found between node 'node-a' and this object"})
    );
    let healthz = json!({"nonResourceAttributes": {"path": "/healthz", "verb": "get"}});
    assert_eq!(api.may_i(&node, healthz).await["allowed"], true);
}

#[tokio::test]
async fn a_subject_access_review_judges_the_named_subject_not_the_caller() {
    let api = Api::new().await;
    let review = |user: &str, groups: Value| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "resourceAttributes": {"verb": "create", "group": "apps", "resource": "deployments", "namespace": "default"}}})
    };
    let (code, body) = api.send(ADMIN, "POST", SAR, Some(&review("system:node:node-a", json!(["system:nodes"])))).await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(body["status"]["allowed"], false, "{body}");
    assert_eq!(body["spec"]["user"], "system:node:node-a");
    let (_, body) = api.send(ADMIN, "POST", SAR, Some(&review("bob", json!([])))).await;
    assert_eq!(body["status"], json!({"allowed": true}));
    // Without a subject the review is invalid.
    let (code, body) = api.send(ADMIN, "POST", SAR, Some(&review("", json!([])))).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        body["message"],
        "SubjectAccessReview.authorization.k8s.io \"\" is invalid: spec.user: Invalid value: \"\": at least one of user or group must be specified"
    );
    // A node may ask what it may do itself, but not what others may.
    let node = api.node.clone();
    let (code, _) = api.send(&node, "POST", SAR, Some(&review("bob", json!([])))).await;
    assert_eq!(code, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn a_local_subject_access_review_judges_the_subject_in_the_namespace_it_is_posted_in() {
    let api = Api::new().await;
    let path = "/apis/authorization.k8s.io/v1/namespaces/team/localsubjectaccessreviews";
    let review = |metadata: Value, namespace: &str| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "LocalSubjectAccessReview", "metadata": metadata,
            "spec": {"user": "system:node:node-a", "groups": ["system:nodes"],
                     "resourceAttributes": {"verb": "list", "resource": "configmaps", "namespace": namespace}}})
    };
    let (code, body) = api.send(ADMIN, "POST", path, Some(&review(json!({}), "team"))).await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(body["metadata"]["namespace"], "team");
    assert_eq!(body["status"]["allowed"], false, "a node lists no configmaps: {body}");
    let (_, body) = api.send(ADMIN, "POST", path, Some(&review(json!({"namespace": "team"}), "team"))).await;
    assert_eq!(body["kind"], "LocalSubjectAccessReview", "{body}");
    // About another namespace than its own, or posted in another one: refused.
    let (code, body) = api.send(ADMIN, "POST", path, Some(&review(json!({}), "other"))).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .ends_with("spec.resourceAttributes.namespace: Invalid value: \"other\": must match metadata.namespace"),
        "{body}"
    );
    let (code, body) = api.send(ADMIN, "POST", path, Some(&review(json!({"namespace": "other"}), "other"))).await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        body["message"],
        "the namespace of the provided object does not match the namespace sent on the request"
    );
}

#[tokio::test]
async fn a_self_subject_review_tells_the_caller_who_it_is() {
    let api = Api::new().await;
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let (code, body) = api.send(ALICE, "POST", SSR, Some(&review)).await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(
        body["status"]["userInfo"],
        json!({"username": "alice", "uid": "uid-alice", "groups": ["dev", "system:authenticated"]})
    );
    let node = api.node.clone();
    let (code, body) = api.send(&node, "POST", SSR, Some(&json!({}))).await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(body["kind"], "SelfSubjectReview");
    assert_eq!(body["status"]["userInfo"]["username"], "system:node:node-a");
}

#[tokio::test]
async fn reviews_are_created_only() {
    let api = Api::new().await;
    for path in [SSAR, SAR, SSR, SSRR] {
        let (code, body) = api.send(ADMIN, "GET", path, None).await;
        assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED, "{path}: {body}");
    }
    let (code, body) = api.send(ADMIN, "POST", SSAR, Some(&json!({"spec": {}}))).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    // Nor shown as a Table: 406, as kube-apiserver answers.
    let req = Request::builder()
        .method("POST")
        .uri(SSAR)
        .header("content-type", "application/json")
        .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .header("authorization", format!("Bearer {ADMIN}"));
    let review = json!({"spec": {"nonResourceAttributes": {"path": "/", "verb": "get"}}});
    let resp = router(api.state.clone()).oneshot(req.body(Body::from(review.to_string())).unwrap()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_ACCEPTABLE);
    let status: Value = serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(status["reason"], "NotAcceptable", "{status}");
    assert_eq!(body["details"]["kind"], "SelfSubjectAccessReview");
}

#[tokio::test]
async fn discovery_lists_the_reviews_and_their_protobuf_messages_exist() {
    let api = Api::new().await;
    let (_, groups) = api.send(ADMIN, "GET", "/apis", None).await;
    let names: Vec<&str> = groups["groups"].as_array().unwrap().iter().map(|g| g["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"authorization.k8s.io"), "{names:?}");
    let (code, list) = api.send(ADMIN, "GET", "/apis/authorization.k8s.io/v1", None).await;
    assert_eq!(code, StatusCode::OK);
    let plural = |list: &Value| -> Vec<String> {
        list["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(
        plural(&list),
        ["localsubjectaccessreviews", "selfsubjectaccessreviews", "selfsubjectrulesreviews", "subjectaccessreviews"]
    );
    let local = &list["resources"][0];
    assert_eq!((local["namespaced"].as_bool(), local["kind"].as_str()), (Some(true), Some("LocalSubjectAccessReview")));
    let (_, list) = api.send(ADMIN, "GET", "/apis/authentication.k8s.io/v1", None).await;
    assert_eq!(plural(&list), ["tokenreviews", "selfsubjectreviews"]);
    for kind in ["LocalSubjectAccessReview", "SelfSubjectAccessReview", "SubjectAccessReview", "SelfSubjectRulesReview"]
    {
        assert!(protobuf::supports("authorization.k8s.io/v1", kind), "{kind}");
    }
    assert!(protobuf::supports("authentication.k8s.io/v1", "SelfSubjectReview"));
}

/// The rules review of the owner of `token` in `namespace`: (group, resource) → verbs, and
/// whether the list is incomplete.
async fn rules(api: &Api, token: &str, namespace: &str) -> (Vec<(String, String, Vec<String>)>, Value) {
    let review = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": namespace}});
    let (code, body) = api.send(token, "POST", SSRR, Some(&review)).await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    let strings =
        |v: &Value| -> Vec<String> { v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect() };
    let list = body["status"]["resourceRules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (strings(&r["apiGroups"]).join(","), strings(&r["resources"]).join(","), strings(&r["verbs"])))
        .collect();
    (list, body["status"].clone())
}

#[tokio::test]
async fn a_rules_review_lists_what_the_authorizer_allows() {
    let api = Api::new().await;
    let (admin, status) = rules(&api, ADMIN, "default").await;
    assert_eq!(admin, [("*".to_string(), "*".to_string(), vec!["*".to_string()])]);
    assert_eq!(status["incomplete"], false);

    let (alice, status) = rules(&api, ALICE, "default").await;
    let pods = alice.iter().find(|(g, r, _)| g.is_empty() && r == "pods").expect("pods are listed");
    assert_eq!(pods.2.len(), 8, "every verb on pods: {pods:?}");
    assert!(!alice.iter().any(|(_, r, _)| r == "tokenreviews"), "alice may not review tokens");
    assert_eq!(status["incomplete"], false);

    let node = api.node.clone();
    let (rules, status) = rules(&api, &node, "default").await;
    let verbs = |group: &str, resource: &str| -> Vec<String> {
        rules.iter().find(|(g, r, _)| g == group && r == resource).map(|(_, _, v)| v.clone()).unwrap_or_default()
    };
    assert_eq!(verbs("", "pods"), ["create", "delete", "get", "list", "watch"]);
    assert_eq!(verbs("", "pods/status"), ["patch", "update"]);
    assert!(verbs("apps", "deployments").is_empty());
    assert_eq!(verbs("authorization.k8s.io", "selfsubjectrulesreviews"), ["create"]);
    assert_eq!(status["incomplete"], true, "the node's named permissions are not listed");
    let healthz = json!({"verbs": ["get"], "nonResourceURLs": ["/healthz"]});
    assert!(status["nonResourceRules"].as_array().unwrap().contains(&healthz), "{status}");
}
