//! Service account tokens through the whole router: TokenRequest signs them, the authenticator
//! and TokenReview accept them while their ServiceAccount (and bound pod) exist and they are
//! current, and the ServiceAccount admission plugin mounts them into pods.

use std::sync::Arc;

use axum::body::Body;
use berth_apiserver::admission::Admission;
use berth_apiserver::authn::{NODE_TOKEN_FILE, TokenAuthenticator, create_node_token};
use berth_apiserver::satoken::{Claims, DEFAULT_ISSUER, ObjectRef, TokenKeys};
use berth_apiserver::services::ServiceNetwork;
use berth_apiserver::{ApiState, lifecycle, router};
use berth_store::sqlite::SqliteStore;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const ADMIN: &str = "admin-token-0123456789";
const SA: &str = "/api/v1/namespaces/default/serviceaccounts";
const PODS: &str = "/api/v1/namespaces/default/pods";
const REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";

struct Api {
    state: Arc<ApiState>,
    dir: tempfile::TempDir,
}

impl Api {
    async fn new(admission: Admission) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
        let mut authn = TokenAuthenticator::new(ADMIN.into());
        authn.watch_token_file(&dir.path().join(NODE_TOKEN_FILE)).unwrap();
        let state = ApiState::with_service_account_tokens(
            Arc::new(store),
            Some(authn),
            admission,
            ServiceNetwork::default(),
            Some(TokenKeys::generate()),
        );
        lifecycle::bootstrap(&state).await.unwrap();
        Api { state, dir }
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

    async fn create(&self, path: &str, obj: Value) -> Value {
        let (code, body) = self.send(ADMIN, "POST", path, Some(&obj)).await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
        body
    }

    async fn service_account(&self, name: &str) -> Value {
        self.create(SA, json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})).await
    }

    /// Asks for a token of ServiceAccount `name` in `default` as `as_token`.
    async fn request_token(&self, as_token: &str, name: &str, spec: Value) -> (StatusCode, Value) {
        let req = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec});
        self.send(as_token, "POST", &format!("{SA}/{name}/token"), Some(&req)).await
    }

    async fn token(&self, name: &str, spec: Value) -> String {
        let (code, body) = self.request_token(ADMIN, name, spec).await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
        body["status"]["token"].as_str().unwrap().to_string()
    }

    async fn review(&self, token: &str) -> Value {
        let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}});
        let (code, body) = self.send(ADMIN, "POST", REVIEWS, Some(&review)).await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
        body["status"].clone()
    }
}

fn pod(name: &str, spec: Value) -> Value {
    let mut spec = spec;
    spec["containers"] = json!([{"name": "app", "image": "nginx"}]);
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
}

#[tokio::test]
async fn a_requested_token_authenticates_as_its_service_account() {
    let api = Api::new(Admission::default()).await;
    let sa = api.service_account("robot").await;
    let (code, body) = api.request_token(ADMIN, "robot", json!({})).await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(body["kind"], "TokenRequest");
    assert_eq!(body["spec"]["expirationSeconds"], 3600);
    assert_eq!(body["spec"]["audiences"], json!([DEFAULT_ISSUER]));
    assert!(body["status"]["expirationTimestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{body}");
    let token = body["status"]["token"].as_str().unwrap();
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");

    let (code, list) = api.send(token, "GET", "/api/v1/namespaces/default/configmaps", None).await;
    assert_eq!(code, StatusCode::OK, "{list}");
    assert_eq!(list["kind"], "ConfigMapList");

    let status = api.review(token).await;
    assert_eq!(status["authenticated"], true, "{status}");
    assert_eq!(status["user"]["username"], "system:serviceaccount:default:robot");
    assert_eq!(status["user"]["uid"], sa["metadata"]["uid"]);
    assert_eq!(
        status["user"]["groups"],
        json!(["system:serviceaccounts", "system:serviceaccounts:default", "system:authenticated"])
    );
    assert_eq!(status["audiences"], json!([DEFAULT_ISSUER]));
}

#[tokio::test]
async fn token_requests_for_missing_accounts_or_too_short_lives_fail_as_kubernetes_does() {
    let api = Api::new(Admission::default()).await;
    let (code, body) = api.request_token(ADMIN, "nobody", json!({})).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert_eq!(body["message"], "serviceaccounts \"nobody\" not found");

    api.service_account("robot").await;
    let (code, body) = api.request_token(ADMIN, "robot", json!({"expirationSeconds": 599})).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        body["message"],
        "TokenRequest.authentication.k8s.io \"\" is invalid: spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 10 minutes"
    );
    let bound = json!({"boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "ghost"}});
    let (code, body) = api.request_token(ADMIN, "robot", bound).await;
    assert_eq!((code, body["message"].as_str()), (StatusCode::NOT_FOUND, Some("pods \"ghost\" not found")));
}

#[tokio::test]
async fn a_pod_bound_token_is_refused_once_the_pod_is_deleted() {
    let api = Api::new(Admission::default()).await;
    api.service_account("robot").await;
    let web = api.create(PODS, pod("web", json!({"serviceAccountName": "robot"}))).await;
    let uid = web["metadata"]["uid"].as_str().unwrap();

    let wrong = json!({"boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "not-it"}});
    let (code, body) = api.request_token(ADMIN, "robot", wrong).await;
    assert_eq!(code, StatusCode::CONFLICT, "{body}");
    assert!(body["message"].as_str().unwrap().contains("does not match the UID in record"), "{body}");

    let bound = json!({"boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": uid}});
    let token = api.token("robot", bound).await;
    let status = api.review(&token).await;
    assert_eq!(status["user"]["extra"]["authentication.kubernetes.io/pod-name"], json!(["web"]), "{status}");
    assert_eq!(status["user"]["extra"]["authentication.kubernetes.io/pod-uid"], json!([uid]));
    let (code, _) = api.send(&token, "GET", "/api/v1/namespaces/default/configmaps", None).await;
    assert_eq!(code, StatusCode::OK);
    let whoami = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let (code, me) = api.send(&token, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", Some(&whoami)).await;
    assert_eq!(code, StatusCode::CREATED, "{me}");
    assert_eq!(me["status"]["userInfo"]["extra"]["authentication.kubernetes.io/pod-uid"], json!([uid]), "{me}");

    let (code, body) = api.send(ADMIN, "DELETE", &format!("{PODS}/web?gracePeriodSeconds=0"), None).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (code, _) = api.send(ADMIN, "GET", &format!("{PODS}/web"), None).await;
    assert_eq!(code, StatusCode::NOT_FOUND, "the pod is gone");
    let (code, _) = api.send(&token, "GET", "/api/v1/namespaces/default/configmaps", None).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    assert_eq!(api.review(&token).await["authenticated"], false);
}

#[tokio::test]
async fn an_expired_token_or_one_of_a_deleted_service_account_is_refused() {
    let api = Api::new(Admission::default()).await;
    let sa = api.service_account("robot").await;
    let sa_ref = ObjectRef { name: "robot".into(), uid: sa["metadata"]["uid"].as_str().unwrap().into() };
    let keys = api.state.service_account_tokens.as_ref().unwrap();
    let now = jiff::Timestamp::now().as_second();
    let expired = Claims::new(DEFAULT_ISSUER, vec![DEFAULT_ISSUER.into()], now - 7200, 3600, "default", sa_ref.clone());
    let (code, _) = api.send(&keys.sign(&expired), "GET", "/api/v1/namespaces/default/configmaps", None).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    let current = Claims::new(DEFAULT_ISSUER, vec![DEFAULT_ISSUER.into()], now, 3600, "default", sa_ref);
    let (code, _) = api.send(&keys.sign(&current), "GET", "/api/v1/namespaces/default/configmaps", None).await;
    assert_eq!(code, StatusCode::OK, "the same claims, current, are accepted");

    let token = api.token("robot", json!({})).await;
    let (code, _) = api.send(ADMIN, "DELETE", &format!("{SA}/robot"), None).await;
    assert_eq!(code, StatusCode::OK);
    let (code, _) = api.send(&token, "GET", "/api/v1/namespaces/default/configmaps", None).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_node_gets_tokens_only_bound_to_pods_on_it() {
    let api = Api::new(Admission::default()).await;
    let node = create_node_token(api.dir.path(), "node-a").unwrap();
    api.service_account("robot").await;
    api.create(PODS, pod("here", json!({"serviceAccountName": "robot", "nodeName": "node-a"}))).await;
    api.create(PODS, pod("there", json!({"serviceAccountName": "robot", "nodeName": "node-b"}))).await;

    let (code, body) = api.request_token(&node, "robot", json!({})).await;
    assert_eq!(code, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["message"], "serviceaccounts \"robot\" is forbidden: node requested token not bound to a pod");
    let there = json!({"boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "there"}});
    let (code, body) = api.request_token(&node, "robot", there).await;
    assert_eq!(code, StatusCode::FORBIDDEN, "{body}");
    let here =
        json!({"boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "here"}, "expirationSeconds": 3607});
    let (code, body) = api.request_token(&node, "robot", here).await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    let (code, _) = api.request_token(&node, "default", json!({})).await;
    assert_eq!(code, StatusCode::FORBIDDEN, "no pod of the node runs as it");
}

#[tokio::test]
async fn the_token_subresource_is_in_discovery() {
    let api = Api::new(Admission::default()).await;
    let (_, body) = api.send(ADMIN, "GET", "/api/v1", None).await;
    let token = body["resources"].as_array().unwrap().iter().find(|r| r["name"] == "serviceaccounts/token").cloned();
    let token = token.expect("serviceaccounts/token listed");
    assert_eq!(
        (&token["kind"], &token["group"], &token["verbs"]),
        (&json!("TokenRequest"), &json!("authentication.k8s.io"), &json!(["create"]))
    );
}

#[tokio::test]
async fn the_admission_plugin_mounts_the_token_unless_automount_is_off() {
    let api = Api::new(Admission { service_account: true, ..Default::default() }).await;
    let (code, body) = api.send(ADMIN, "POST", PODS, Some(&pod("early", json!({})))).await;
    assert_eq!(code, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(
        body["message"],
        "pods \"early\" is forbidden: error looking up service account default/default: serviceaccount \"default\" not found"
    );

    api.service_account("default").await;
    let web = api.create(PODS, pod("web", json!({}))).await;
    assert_eq!(web["spec"]["serviceAccountName"], "default");
    let volume = &web["spec"]["volumes"][0];
    let name = volume["name"].as_str().unwrap();
    assert!(name.starts_with("kube-api-access-") && name.len() == "kube-api-access-".len() + 5, "{name}");
    assert_eq!(volume["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"], 3607);
    assert_eq!(volume["projected"]["sources"][1]["configMap"]["name"], "kube-root-ca.crt");
    assert_eq!(
        web["spec"]["containers"][0]["volumeMounts"],
        json!([{"name": name, "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}])
    );

    let quiet = api.create(PODS, pod("quiet", json!({"automountServiceAccountToken": false}))).await;
    assert!(quiet["spec"].get("volumes").is_none_or(|v| v.as_array().is_some_and(|v| v.is_empty())), "{quiet}");
    assert!(quiet["spec"]["containers"][0].get("volumeMounts").is_none(), "{quiet}");

    let mirror = pod("static-web", json!({"nodeName": "node-a", "serviceAccountName": "nobody"}));
    let mut mirror = mirror;
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "hash"});
    let (code, body) = api.send(ADMIN, "POST", PODS, Some(&mirror)).await;
    assert_eq!(code, StatusCode::CREATED, "mirror pods are skipped: {body}");
}
