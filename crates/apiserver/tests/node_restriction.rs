//! Node identity through the whole router: node tokens from the data dir (picked up while the
//! server runs), the Node authorizer, NodeRestriction admission on every write path, TokenReview,
//! and full access kept for every other user. Forbidden requests change nothing.

use std::sync::Arc;

use axum::body::Body;
use berth_apiserver::authn::{NODE_TOKEN_FILE, TokenAuthenticator, create_node_token};
use berth_apiserver::{ApiState, lifecycle, router};
use berth_store::sqlite::SqliteStore;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const ADMIN: &str = "admin-token-0123456789";
const ALICE: &str = "alice-token-0123456789";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";

struct Api {
    state: Arc<ApiState>,
    dir: tempfile::TempDir,
    node_a: String,
    node_b: String,
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
        // Created after the authenticator loaded the (then missing) file: found by reloading.
        let node_a = create_node_token(dir.path(), "node-a").unwrap();
        let node_b = create_node_token(dir.path(), "node-b").unwrap();
        Api { state, dir, node_a, node_b }
    }

    async fn send(
        &self,
        token: &str,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> (StatusCode, Value) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", content_type)
            .header("authorization", format!("Bearer {token}"));
        let body = body.map(|b| Body::from(b.to_string())).unwrap_or_else(Body::empty);
        let resp = router(self.state.clone()).oneshot(req.body(body).unwrap()).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    async fn call(&self, token: &str, method: &str, path: &str, body: Option<&Value>) -> (StatusCode, Value) {
        let content_type = if method == "PATCH" { "application/merge-patch+json" } else { "application/json" };
        self.send(token, method, path, content_type, body).await
    }

    /// Asserts success and returns the body.
    async fn ok(&self, token: &str, method: &str, path: &str, body: Option<&Value>) -> Value {
        let (status, out) = self.call(token, method, path, body).await;
        assert!(status.is_success(), "{method} {path}: {status} {out}");
        out
    }

    /// Asserts a 403 Forbidden Status and returns its message.
    async fn forbidden(&self, token: &str, method: &str, path: &str, body: Option<&Value>) -> String {
        let (status, out) = self.call(token, method, path, body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {out}");
        assert_eq!(
            (out["kind"].as_str(), out["reason"].as_str(), out["code"].as_i64()),
            (Some("Status"), Some("Forbidden"), Some(403))
        );
        out["message"].as_str().unwrap().to_string()
    }

    async fn revision(&self) -> i64 {
        self.state.store.current_revision().await.unwrap()
    }
}

fn node(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
}

fn lease(name: &str) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name},
           "spec": {"holderIdentity": name, "leaseDurationSeconds": 40}})
}

fn pod(name: &str, node: &str, volumes: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "web"}},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}], "volumes": volumes}})
}

fn secret(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"k": "v"}})
}

#[tokio::test]
async fn a_node_registers_itself_heartbeats_its_lease_and_reports_status() {
    let api = Api::new().await;
    let a = api.node_a.clone();
    api.ok(
        &a,
        "POST",
        "/api/v1/nodes",
        Some(&node("node-a", json!({"kubernetes.io/hostname": "node-a", "kubernetes.io/os": "linux"}))),
    )
    .await;
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    let out = api.ok(&a, "PATCH", "/api/v1/nodes/node-a/status", Some(&ready)).await;
    assert_eq!(out["status"]["conditions"][0]["type"], "Ready");
    api.ok(&a, "POST", LEASES, Some(&lease("node-a"))).await;
    let mut renewed = api.ok(&a, "GET", &format!("{LEASES}/node-a"), None).await;
    renewed["spec"]["renewTime"] = json!("2026-01-01T00:00:00.000000Z");
    api.ok(&a, "PUT", &format!("{LEASES}/node-a"), Some(&renewed)).await;
    let list = api.ok(&a, "GET", &format!("{LEASES}?fieldSelector=metadata.name%3Dnode-a"), None).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    // Reads kubelets need.
    for path in [
        "/api/v1/nodes",
        "/api/v1/nodes/node-a",
        "/api/v1/pods",
        "/api/v1/namespaces",
        "/apis/node.k8s.io/v1/runtimeclasses",
    ] {
        api.ok(&a, "GET", path, None).await;
    }
    let event = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "node-a.1"},
                       "involvedObject": {"kind": "Node", "name": "node-a"}, "reason": "Starting", "message": "started"});
    api.ok(&a, "POST", "/api/v1/namespaces/default/events", Some(&event)).await;
}

#[tokio::test]
async fn a_node_cannot_touch_another_nodes_node_or_lease_and_nothing_changes() {
    let api = Api::new().await;
    let a = api.node_a.clone();
    api.ok(ADMIN, "POST", "/api/v1/nodes", Some(&node("node-b", json!({})))).await;
    api.ok(&api.node_b, "POST", LEASES, Some(&lease("node-b"))).await;
    let before = api.revision().await;
    let patch = json!({"metadata": {"labels": {"owned": "by-a"}}});
    assert_eq!(
        api.forbidden(&a, "PATCH", "/api/v1/nodes/node-b", Some(&patch)).await,
        r#"nodes "node-b" is forbidden: node "node-a" is not allowed to modify node "node-b""#
    );
    assert_eq!(
        api.forbidden(&a, "PATCH", "/api/v1/nodes/node-b/status", Some(&json!({"status": {"phase": "x"}}))).await,
        r#"nodes "node-b" is forbidden: node "node-a" is not allowed to modify node "node-b""#
    );
    assert_eq!(
        api.forbidden(&a, "DELETE", "/api/v1/nodes/node-b", None).await,
        r#"nodes "node-b" is forbidden: node "node-a" is not allowed to modify node "node-b""#
    );
    assert_eq!(
        api.forbidden(&a, "POST", "/api/v1/nodes", Some(&node("node-c", json!({})))).await,
        r#"nodes "node-c" is forbidden: node "node-a" is not allowed to modify node "node-c""#
    );
    assert_eq!(
        api.forbidden(&a, "POST", LEASES, Some(&lease("node-c"))).await,
        r#"leases.coordination.k8s.io "node-c" is forbidden: can only access node lease with the same name as the requesting node"#
    );
    assert_eq!(
        api.forbidden(&a, "DELETE", &format!("{LEASES}/node-b"), None).await,
        r#"leases.coordination.k8s.io "node-b" is forbidden: User "system:node:node-a" cannot delete resource "leases" in API group "coordination.k8s.io" in the namespace "kube-node-lease": can only access node lease with the same name as the requesting node"#
    );
    assert_eq!(
        api.forbidden(&a, "GET", "/api/v1/nodes/node-b/proxy", None).await,
        r#"nodes "node-b" is forbidden: User "system:node:node-a" cannot get resource "nodes/proxy" in API group "" at the cluster scope"#
    );
    assert_eq!(api.revision().await, before, "a forbidden request wrote to the store");
    let b = api.ok(ADMIN, "GET", "/api/v1/nodes/node-b", None).await;
    assert!(b["metadata"].get("labels").is_none_or(|l| l.get("owned").is_none()), "{b}");
}

#[tokio::test]
async fn node_restriction_labels_are_refused_on_create_and_every_kind_of_update() {
    let api = Api::new().await;
    let a = api.node_a.clone();
    let restricted = node("node-a", json!({"node-restriction.kubernetes.io/pool": "gpu"}));
    assert_eq!(
        api.forbidden(&a, "POST", "/api/v1/nodes", Some(&restricted)).await,
        r#"nodes "node-a" is forbidden: node "node-a" is not allowed to set the following labels: node-restriction.kubernetes.io/pool"#
    );
    api.ok(&a, "POST", "/api/v1/nodes", Some(&node("node-a", json!({"app": "x"})))).await;
    let message =
        r#"nodes "node-a" is forbidden: is not allowed to modify labels: node-restriction.kubernetes.io/pool"#;
    let merge = json!({"metadata": {"labels": {"node-restriction.kubernetes.io/pool": "gpu"}}});
    assert_eq!(api.forbidden(&a, "PATCH", "/api/v1/nodes/node-a", Some(&merge)).await, message);
    let json_patch =
        json!([{"op": "add", "path": "/metadata/labels/node-restriction.kubernetes.io~1pool", "value": "gpu"}]);
    let (status, out) =
        api.send(&a, "PATCH", "/api/v1/nodes/node-a", "application/json-patch+json", Some(&json_patch)).await;
    assert_eq!((status, out["message"].as_str()), (StatusCode::FORBIDDEN, Some(message)));
    let (status, out) =
        api.send(&a, "PATCH", "/api/v1/nodes/node-a", "application/strategic-merge-patch+json", Some(&merge)).await;
    assert_eq!((status, out["message"].as_str()), (StatusCode::FORBIDDEN, Some(message)));
    let mut put = api.ok(&a, "GET", "/api/v1/nodes/node-a", None).await;
    put["metadata"]["labels"]["node-restriction.kubernetes.io/pool"] = json!("gpu");
    assert_eq!(api.forbidden(&a, "PUT", "/api/v1/nodes/node-a", Some(&put)).await, message);

    // An admin's restricted label cannot be removed by the node, but other labels still change.
    api.ok(ADMIN, "PATCH", "/api/v1/nodes/node-a", Some(&merge)).await;
    let remove = json!({"metadata": {"labels": {"node-restriction.kubernetes.io/pool": null}}});
    assert_eq!(api.forbidden(&a, "PATCH", "/api/v1/nodes/node-a", Some(&remove)).await, message);
    let out = api.ok(&a, "PATCH", "/api/v1/nodes/node-a", Some(&json!({"metadata": {"labels": {"app": "y"}}}))).await;
    assert_eq!(out["metadata"]["labels"], json!({"app": "y", "node-restriction.kubernetes.io/pool": "gpu"}));
    let taint = json!({"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}});
    assert_eq!(
        api.forbidden(&a, "PATCH", "/api/v1/nodes/node-a", Some(&taint)).await,
        r#"nodes "node-a" is forbidden: node "node-a" is not allowed to modify taints"#
    );
}

#[tokio::test]
async fn a_node_updates_status_and_deletes_only_pods_bound_to_it_and_creates_none() {
    let api = Api::new().await;
    let a = api.node_a.clone();
    api.ok(ADMIN, "POST", "/api/v1/namespaces/default/pods", Some(&pod("web-a", "node-a", json!([])))).await;
    api.ok(ADMIN, "POST", "/api/v1/namespaces/default/pods", Some(&pod("web-b", "node-b", json!([])))).await;
    let running = json!({"status": {"phase": "Running"}});
    let out = api.ok(&a, "PATCH", "/api/v1/namespaces/default/pods/web-a/status", Some(&running)).await;
    assert_eq!(out["status"]["phase"], "Running");
    let before = api.revision().await;
    assert_eq!(
        api.forbidden(&a, "PATCH", "/api/v1/namespaces/default/pods/web-b/status", Some(&running)).await,
        r#"pods "web-b" is forbidden: node "node-a" can only update pod status for pods with spec.nodeName set to itself"#
    );
    let mut put = api.ok(ADMIN, "GET", "/api/v1/namespaces/default/pods/web-b", None).await;
    put["status"]["phase"] = json!("Failed");
    assert!(
        api.forbidden(&a, "PUT", "/api/v1/namespaces/default/pods/web-b/status", Some(&put))
            .await
            .contains("can only update pod status")
    );
    assert_eq!(
        api.forbidden(&a, "DELETE", "/api/v1/namespaces/default/pods/web-b", None).await,
        r#"pods "web-b" is forbidden: node "node-a" can only delete pods with spec.nodeName set to itself"#
    );
    assert_eq!(
        api.forbidden(
            &a,
            "PATCH",
            "/api/v1/namespaces/default/pods/web-a",
            Some(&json!({"metadata": {"labels": {"x": "y"}}}))
        )
        .await,
        r#"pods "web-a" is forbidden: User "system:node:node-a" cannot patch resource "pods" in API group "" in the namespace "default""#
    );
    assert_eq!(
        api.forbidden(&a, "POST", "/api/v1/namespaces/default/pods", Some(&pod("sneaky", "node-a", json!([])))).await,
        r#"pods "sneaky" is forbidden: pod does not have "kubernetes.io/config.mirror" annotation, node "node-a" can only create mirror pods"#
    );
    assert_eq!(
        api.forbidden(&a, "DELETE", "/api/v1/namespaces/default/pods", None).await,
        r#"pods is forbidden: User "system:node:node-a" cannot deletecollection resource "pods" in API group "" in the namespace "default""#
    );
    assert_eq!(api.revision().await, before, "a forbidden request wrote to the store");
    // A graceful delete of its own pod marks it, then the node's confirmation removes it.
    let out = api.ok(&a, "DELETE", "/api/v1/namespaces/default/pods/web-a", None).await;
    assert!(out["metadata"]["deletionTimestamp"].is_string(), "{out}");
    api.ok(&a, "DELETE", "/api/v1/namespaces/default/pods/web-a?gracePeriodSeconds=0", None).await;
    let (status, _) = api.call(ADMIN, "GET", "/api/v1/namespaces/default/pods/web-a", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_node_reads_only_the_secrets_and_configmaps_of_pods_bound_to_it() {
    let api = Api::new().await;
    let a = api.node_a.clone();
    for name in ["mounted", "from-env", "pull", "unrelated", "theirs"] {
        api.ok(ADMIN, "POST", "/api/v1/namespaces/default/secrets", Some(&secret(name))).await;
    }
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"a": "b"}});
    api.ok(ADMIN, "POST", "/api/v1/namespaces/default/configmaps", Some(&cm)).await;
    let mut mine = pod(
        "web-a",
        "node-a",
        json!([{"name": "s", "secret": {"secretName": "mounted"}}, {"name": "c", "configMap": {"name": "settings"}}]),
    );
    mine["spec"]["containers"][0]["env"] =
        json!([{"name": "X", "valueFrom": {"secretKeyRef": {"name": "from-env", "key": "k"}}}]);
    mine["spec"]["imagePullSecrets"] = json!([{"name": "pull"}]);
    api.ok(ADMIN, "POST", "/api/v1/namespaces/default/pods", Some(&mine)).await;
    let theirs = pod("web-b", "node-b", json!([{"name": "s", "secret": {"secretName": "theirs"}}]));
    api.ok(ADMIN, "POST", "/api/v1/namespaces/default/pods", Some(&theirs)).await;

    for name in ["mounted", "from-env", "pull"] {
        let out = api.ok(&a, "GET", &format!("/api/v1/namespaces/default/secrets/{name}"), None).await;
        assert_eq!(out["data"]["k"], "dg==", "{name}");
    }
    api.ok(&a, "GET", "/api/v1/namespaces/default/configmaps/settings", None).await;
    let list =
        api.ok(&a, "GET", "/api/v1/namespaces/default/secrets?fieldSelector=metadata.name%3Dmounted", None).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    for name in ["unrelated", "theirs"] {
        assert_eq!(
            api.forbidden(&a, "GET", &format!("/api/v1/namespaces/default/secrets/{name}"), None).await,
            format!(
                r#"secrets "{name}" is forbidden: User "system:node:node-a" cannot get resource "secrets" in API group "" in the namespace "default": no relationship found between node 'node-a' and this object"#
            )
        );
    }
    assert_eq!(
        api.forbidden(&a, "GET", "/api/v1/namespaces/default/secrets", None).await,
        r#"secrets is forbidden: User "system:node:node-a" cannot list resource "secrets" in API group "" in the namespace "default": No Object name found"#
    );
    assert!(
        api.forbidden(&a, "PUT", "/api/v1/namespaces/default/secrets/mounted", Some(&secret("mounted")))
            .await
            .ends_with("can only read resources of this type")
    );
    // node-b's own secret is readable to node-b: the graph is per node.
    api.ok(&api.node_b, "GET", "/api/v1/namespaces/default/secrets/theirs", None).await;
}

#[tokio::test]
async fn the_index_of_node_references_follows_pods_from_binding_to_deletion() {
    use berth_apiserver::authz::Referenced;
    let api = Api::new().await;
    for name in ["settings", "later"] {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "b"}});
        api.ok(ADMIN, "POST", "/api/v1/namespaces/default/configmaps", Some(&cm)).await;
    }
    let before = pod("early", "node-a", json!([{"name": "c", "configMap": {"name": "settings"}}]));
    api.ok(ADMIN, "POST", "/api/v1/namespaces/default/pods", Some(&before)).await;
    tokio::spawn(berth_apiserver::node_graph::run(api.state.clone()));
    let index = &api.state.node_references;
    let knows = |node: &str, name: &str| index.references(node, Referenced::ConfigMap, "default", name);
    // The index follows on a task of its own, a moment behind.
    async fn until(what: &str, done: impl Fn() -> bool) {
        for _ in 0..200 {
            if done() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("never: {what}");
    }

    until("a pod bound before the index was read in", || knows("node-a", "settings")).await;
    assert!(!knows("node-b", "settings"), "the references are per node");
    let after = pod("late", "node-b", json!([{"name": "c", "configMap": {"name": "later"}}]));
    api.ok(ADMIN, "POST", "/api/v1/namespaces/default/pods", Some(&after)).await;
    until("a pod bound after the index was built", || knows("node-b", "later")).await;
    api.ok(&api.node_b, "GET", "/api/v1/namespaces/default/configmaps/later", None).await;

    api.ok(ADMIN, "DELETE", "/api/v1/namespaces/default/pods/late?gracePeriodSeconds=0", None).await;
    until("a deleted pod's references are gone", || !knows("node-b", "later")).await;
    api.forbidden(&api.node_b, "GET", "/api/v1/namespaces/default/configmaps/later", None).await;
    api.ok(&api.node_a, "GET", "/api/v1/namespaces/default/configmaps/settings", None).await;
}

#[tokio::test]
async fn token_reviews_are_for_masters_and_nodes_and_name_the_tokens_user() {
    let api = Api::new().await;
    let review = |token: &str| json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}});
    let path = "/apis/authentication.k8s.io/v1/tokenreviews";
    let (status, out) = api.call(&api.node_a, "POST", path, Some(&review(&api.node_b))).await;
    assert_eq!(status, StatusCode::CREATED, "{out}");
    assert_eq!(out["status"]["authenticated"], true);
    assert_eq!(
        out["status"]["user"],
        json!({"username": "system:node:node-b", "groups": ["system:nodes", "system:authenticated"]})
    );
    let (status, out) = api.call(ADMIN, "POST", path, Some(&review(ALICE))).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(out["status"]["user"]["uid"], "uid-alice");
    let (_, out) = api.call(ADMIN, "POST", path, Some(&review("not-a-token"))).await;
    assert_eq!(out["status"]["authenticated"], false);
    assert_eq!(
        api.forbidden(ALICE, "POST", path, Some(&review(ADMIN))).await,
        r#"tokenreviews.authentication.k8s.io is forbidden: User "alice" cannot create resource "tokenreviews" in API group "authentication.k8s.io" at the cluster scope"#
    );
    let (status, out) = api.call(ADMIN, "GET", path, None).await;
    assert_eq!((status, out["reason"].as_str()), (StatusCode::METHOD_NOT_ALLOWED, Some("MethodNotAllowed")));
}

#[tokio::test]
async fn discovery_stays_readable_to_nodes_and_lists_token_reviews() {
    let api = Api::new().await;
    let a = api.node_a.clone();
    let groups = api.ok(&a, "GET", "/apis", None).await;
    assert!(groups["groups"].as_array().unwrap().iter().any(|g| g["name"] == "authentication.k8s.io"), "{groups}");
    let resources = api.ok(&a, "GET", "/apis/authentication.k8s.io/v1", None).await;
    assert_eq!(resources["resources"][0]["name"], "tokenreviews");
    assert_eq!(resources["resources"][0]["verbs"], json!(["create"]));
    for path in ["/api", "/api/v1", "/apis/node.k8s.io/v1", "/version", "/openapi/v3"] {
        api.ok(&a, "GET", path, None).await;
    }
    assert_eq!(
        api.forbidden(&a, "GET", "/metrics", None).await,
        r#"forbidden: User "system:node:node-a" cannot get path "/metrics""#
    );
}

#[tokio::test]
async fn other_users_keep_full_access() {
    let api = Api::new().await;
    api.ok(ADMIN, "POST", "/api/v1/nodes", Some(&node("node-b", json!({})))).await;
    let restricted = json!({"metadata": {"labels": {"node-restriction.kubernetes.io/pool": "gpu"}}});
    api.ok(ALICE, "PATCH", "/api/v1/nodes/node-b", Some(&restricted)).await;
    api.ok(ALICE, "POST", "/api/v1/namespaces/default/secrets", Some(&secret("s"))).await;
    api.ok(ALICE, "GET", "/api/v1/namespaces/default/secrets", None).await;
    api.ok(ALICE, "GET", "/metrics", None).await;
}

#[tokio::test]
async fn a_token_created_while_serving_works_at_once_and_a_removed_one_stops() {
    let api = Api::new().await;
    let c = create_node_token(api.dir.path(), "node-c").unwrap();
    api.ok(&c, "POST", "/api/v1/nodes", Some(&node("node-c", json!({})))).await;
    let file = api.dir.path().join(NODE_TOKEN_FILE);
    let kept: String = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with(&c))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&file, kept).unwrap();
    tokio::time::sleep(berth_apiserver::authn::NODE_TOKENS_RECHECK + std::time::Duration::from_millis(100)).await;
    let (status, _) = api.call(&c, "GET", "/api/v1/nodes", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    api.ok(&api.node_a, "GET", "/api/v1/nodes", None).await;
}
