//! Who may do what: Kubernetes' Node authorizer for node agents (user `system:node:<node>` in
//! group `system:nodes`). Users in `system:masters` may do anything; every other authenticated
//! user may do anything but review tokens. Everyone may ask who they are and what they may do
//! (the self reviews of `system:basic-user`).
//!
//! Authorization looks only at the request's attributes, before routing
//! ([`authorize_request`]), as kube-apiserver's authorization filter does. What a node may write
//! is narrowed further by the NodeRestriction admission plugin
//! ([`crate::admission::node_restriction`]), which looks at the objects inside the write path; it
//! finds the user in a task-local that the authentication middleware sets ([`serve_as`],
//! [`with_request_user`]), as Kubernetes finds it in the request context.
//!
//! Where Kubernetes 1.33 is stricter than a kubelet needs here, berth follows the system:node
//! role instead: a node may get, list and watch every Node and Pod, list and watch namespaces,
//! services, endpoints and EndpointSlices (the agent is the node's Service proxy), delete its own Node, and list or watch its own Lease by name.

use std::collections::HashSet;
use std::future::Future;

use berth_api::resources::PODS;
use berth_api::selector::FieldSelector;
use berth_store::ListOptions;
use k8s_openapi::api::core::v1::{EnvFromSource, EnvVar, Pod};
use serde_json::{Value, json};

use crate::authn::{MASTERS_GROUP, NODE_USER_PREFIX, NODES_GROUP, UserInfo};
use crate::request::Query;
use crate::{ApiError, ApiResult, ApiState, objects};

/// The namespace of node heartbeat leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

// ---------------------------------------------------------------------------------------------
// Request attributes

/// What a request asks to do, as Kubernetes' `RequestInfo` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `/api/v1/...` or `/apis/<group>/<version>/...` below the discovery documents.
    Resource(ResourceRequest),
    /// Anything else: discovery, health, metrics. The verb is the lowercase HTTP method.
    NonResource { verb: String, path: String },
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceRequest {
    /// get, list, watch, create, update, patch, delete, deletecollection (or "" for others).
    pub verb: String,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    /// From the path, or for list and watch from a `metadata.name=` field selector.
    pub name: String,
}

impl Request {
    /// Parses a request the way kube-apiserver's `RequestInfoFactory` does, on the decoded path.
    pub fn parse(method: &http::Method, path: &str, query: Option<&str>) -> Request {
        let path = percent_encoding::percent_decode_str(path).decode_utf8_lossy().into_owned();
        let trimmed = path.trim_matches('/');
        let parts: Vec<&str> = if trimmed.is_empty() { Vec::new() } else { trimmed.split('/').collect() };
        let non_resource = || Request::NonResource { verb: method.as_str().to_ascii_lowercase(), path: path.clone() };
        if parts.len() < 3 || !matches!(parts[0], "api" | "apis") {
            return non_resource();
        }
        let mut rest = &parts[1..];
        let mut r = ResourceRequest::default();
        if parts[0] == "apis" {
            if rest.len() < 3 {
                return non_resource();
            }
            r.group = rest[0].to_string();
            rest = &rest[1..];
        }
        r.version = rest[0].to_string();
        rest = &rest[1..];
        if matches!(rest.first(), Some(&("watch" | "proxy"))) {
            r.verb = rest[0].to_string();
            rest = &rest[1..];
        } else {
            r.verb = match *method {
                http::Method::POST => "create",
                http::Method::GET | http::Method::HEAD => "get",
                http::Method::PUT => "update",
                http::Method::PATCH => "patch",
                http::Method::DELETE => "delete",
                _ => "",
            }
            .to_string();
        }
        if rest.first() == Some(&"namespaces") && rest.len() > 1 {
            r.namespace = rest[1].to_string();
            // `namespaces/<ns>/status` and `/finalize` are the namespace's own subresources.
            if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
                rest = &rest[2..];
            }
        }
        r.resource = rest.first().copied().unwrap_or_default().to_string();
        r.name = rest.get(1).copied().unwrap_or_default().to_string();
        if r.verb != "proxy" {
            r.subresource = rest.get(2).copied().unwrap_or_default().to_string();
        }
        let q = Query::parse(query);
        if r.name.is_empty() && r.verb == "get" {
            let watch = matches!(q.get("watch"), Some("1" | "t" | "T" | "true" | "TRUE" | "True"));
            r.verb = if watch { "watch" } else { "list" }.to_string();
            let selected = q.get("fieldSelector").and_then(|s| FieldSelector::parse(s).ok());
            if let Some(name) = selected.as_ref().and_then(|s| s.requires_exact_match("metadata.name"))
                && is_path_segment_name(name)
            {
                r.name = name.to_string();
            }
        }
        if r.name.is_empty() && r.verb == "delete" {
            r.verb = "deletecollection".to_string();
        }
        Request::Resource(r)
    }
}

fn is_path_segment_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '%'])
}

// ---------------------------------------------------------------------------------------------
// Identity and decisions

/// Who the user is, as far as authorization cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity<'a> {
    /// In `system:masters`.
    Master,
    /// In `system:nodes` and named `system:node:<node>`.
    Node(&'a str),
    /// In `system:nodes` without a node name: allowed nothing but discovery.
    UnknownNode,
    Other,
}

pub fn identity(user: &UserInfo) -> Identity<'_> {
    if user.in_group(MASTERS_GROUP) {
        return Identity::Master;
    }
    if !user.in_group(NODES_GROUP) {
        return Identity::Other;
    }
    match user.name.strip_prefix(NODE_USER_PREFIX) {
        Some(node) if !node.is_empty() => Identity::Node(node),
        _ => Identity::UnknownNode,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Forbidden; the reason (possibly empty) ends Kubernetes' message.
    Deny(String),
}

fn deny(reason: impl Into<String>) -> Decision {
    Decision::Deny(reason.into())
}

/// What the pods bound to the requesting node reference: the Node authorizer's graph.
pub trait NodeGraph {
    fn references(&self, kind: Referenced, namespace: &str, name: &str) -> bool;
}

impl<F: Fn(Referenced, &str, &str) -> bool> NodeGraph for F {
    fn references(&self, kind: Referenced, namespace: &str, name: &str) -> bool {
        self(kind, namespace, name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Referenced {
    Secret,
    ConfigMap,
    PersistentVolumeClaim,
    ServiceAccount,
}

/// Decides whether `user` may make `request`; `graph` answers for the requesting node.
pub fn authorize(user: &UserInfo, request: &Request, graph: &dyn NodeGraph) -> Decision {
    if is_self_review(request) {
        return Decision::Allow;
    }
    match identity(user) {
        Identity::Master => Decision::Allow,
        Identity::Other => match request {
            Request::Resource(r) if r.group == "authentication.k8s.io" && r.resource == "tokenreviews" => deny(""),
            _ => Decision::Allow,
        },
        Identity::UnknownNode => match request {
            Request::NonResource { verb, path } if is_discovery(verb, path) => Decision::Allow,
            _ => deny(format!("unknown node for user {:?}", user.name)),
        },
        Identity::Node(node) => match request {
            Request::NonResource { verb, path } if is_discovery(verb, path) => Decision::Allow,
            Request::NonResource { .. } => deny(""),
            Request::Resource(r) => authorize_node(node, r, graph),
        },
    }
}

/// What the `system:basic-user` role lets every authenticated user do: ask who they are and
/// what they may do.
fn is_self_review(request: &Request) -> bool {
    let Request::Resource(r) = request else { return false };
    r.verb == "create"
        && r.subresource.is_empty()
        && matches!(
            (r.group.as_str(), r.resource.as_str()),
            ("authorization.k8s.io", "selfsubjectaccessreviews" | "selfsubjectrulesreviews")
                | ("authentication.k8s.io", "selfsubjectreviews")
        )
}

/// The paths the `system:discovery` and `system:public-info-viewer` roles open to everyone.
fn is_discovery(verb: &str, path: &str) -> bool {
    let path = path.trim_end_matches('/');
    verb == "get"
        && (matches!(path, "/api" | "/apis" | "/openapi" | "/version" | "/healthz" | "/livez" | "/readyz")
            || ["/api/", "/apis/", "/openapi/"].iter().any(|p| path.starts_with(p)))
}

/// The Node authorizer's rules, with the static `system:node` rules for everything not subdivided.
fn authorize_node(node: &str, r: &ResourceRequest, graph: &dyn NodeGraph) -> Decision {
    let verb = r.verb.as_str();
    let plain = r.subresource.is_empty();
    let static_rule = |verbs: &[&str]| if plain && verbs.contains(&verb) { Decision::Allow } else { deny("") };
    match (r.group.as_str(), r.resource.as_str()) {
        ("", "secrets") => read_referenced(node, r, Referenced::Secret, graph),
        ("", "configmaps") => read_referenced(node, r, Referenced::ConfigMap, graph),
        ("", "persistentvolumeclaims") => get_referenced(node, r, Referenced::PersistentVolumeClaim, graph),
        ("coordination.k8s.io", "leases") => lease(node, r),
        // NodeRestriction admission limits writes to the node's own Node.
        ("", "nodes") => match (r.subresource.as_str(), verb) {
            ("", "get" | "list" | "watch" | "create" | "update" | "patch" | "delete") => Decision::Allow,
            ("status", "update" | "patch") => Decision::Allow,
            _ => deny(""),
        },
        // NodeRestriction admission limits deletes and status writes to pods bound to the node.
        ("", "pods") => match (r.subresource.as_str(), verb) {
            ("", "get" | "list" | "watch" | "create" | "delete") => Decision::Allow,
            ("status", "update" | "patch") | ("eviction", "create") => Decision::Allow,
            _ => deny(""),
        },
        ("", "events") | ("events.k8s.io", "events") => static_rule(&["create", "update", "patch"]),
        // EndpointSlices: the agent is also the node's Service proxy (system:node-proxier's reads).
        ("", "services" | "endpoints" | "namespaces")
        | ("node.k8s.io", "runtimeclasses")
        | ("discovery.k8s.io", "endpointslices") => static_rule(&["get", "list", "watch"]),
        ("authentication.k8s.io", "tokenreviews") => static_rule(&["create"]),
        ("", "serviceaccounts") => create_token(node, r, graph),
        _ => deny(""),
    }
}

/// Secrets and configmaps: one named object, referenced by a pod bound to the node.
fn read_referenced(node: &str, r: &ResourceRequest, kind: Referenced, graph: &dyn NodeGraph) -> Decision {
    if !matches!(r.verb.as_str(), "get" | "list" | "watch") {
        return deny("can only read resources of this type");
    }
    if !r.subresource.is_empty() {
        return deny("cannot read subresource");
    }
    if r.namespace.is_empty() {
        return deny("can only read namespaced object of this type");
    }
    related(node, r, kind, graph)
}

fn get_referenced(node: &str, r: &ResourceRequest, kind: Referenced, graph: &dyn NodeGraph) -> Decision {
    if r.verb != "get" {
        return deny("can only get individual resources of this type");
    }
    if !r.subresource.is_empty() {
        return deny("cannot get subresource");
    }
    related(node, r, kind, graph)
}

fn related(node: &str, r: &ResourceRequest, kind: Referenced, graph: &dyn NodeGraph) -> Decision {
    if r.name.is_empty() {
        return deny("No Object name found");
    }
    if !graph.references(kind, &r.namespace, &r.name) {
        return deny(format!("no relationship found between node '{node}' and this object"));
    }
    Decision::Allow
}

/// Tokens for the service accounts of pods on the node; NodeRestriction-like checks in the
/// TokenRequest handler bind them to such a pod.
fn create_token(node: &str, r: &ResourceRequest, graph: &dyn NodeGraph) -> Decision {
    if r.verb != "create" || r.name.is_empty() {
        return deny("can only create tokens for individual service accounts");
    }
    if r.subresource != "token" {
        return deny("can only create token subresource of serviceaccount");
    }
    related(node, r, Referenced::ServiceAccount, graph)
}

fn lease(node: &str, r: &ResourceRequest) -> Decision {
    let verb = r.verb.as_str();
    let own_by_selector = matches!(verb, "list" | "watch") && r.name == node;
    if !matches!(verb, "get" | "create" | "update" | "patch" | "delete") && !own_by_selector {
        return deny("can only get, create, update, patch, or delete a node lease");
    }
    if r.namespace != NODE_LEASE_NAMESPACE {
        return deny(format!("can only access leases in the {NODE_LEASE_NAMESPACE:?} system namespace"));
    }
    // On create the name is in the body: admission checks it.
    if verb != "create" && r.name != node {
        return deny("can only access node lease with the same name as the requesting node");
    }
    Decision::Allow
}

/// The 403 kube-apiserver answers to a request its authorizers did not allow.
pub fn forbidden(user: &UserInfo, request: &Request, reason: &str) -> ApiError {
    let (qualified, name, mut message, details) = match request {
        Request::NonResource { verb, path } => {
            (String::new(), "", format!("User {:?} cannot {verb} path {path:?}", user.name), json!({}))
        }
        Request::Resource(r) => {
            let resource =
                if r.subresource.is_empty() { r.resource.clone() } else { format!("{}/{}", r.resource, r.subresource) };
            let scope = if r.namespace.is_empty() {
                "at the cluster scope".to_string()
            } else {
                format!("in the namespace {:?}", r.namespace)
            };
            let message = format!(
                "User {:?} cannot {} resource {resource:?} in API group {:?} {scope}",
                user.name, r.verb, r.group
            );
            let qualified = if r.group.is_empty() { r.resource.clone() } else { format!("{}.{}", r.resource, r.group) };
            let mut details = json!({});
            for (key, value) in [("name", &r.name), ("group", &r.group), ("kind", &r.resource)] {
                if !value.is_empty() {
                    details[key] = json!(value);
                }
            }
            (qualified, r.name.as_str(), message, details)
        }
    };
    if !reason.is_empty() {
        message = format!("{message}: {reason}");
    }
    let full = match (qualified.is_empty(), name.is_empty()) {
        (true, _) => format!("forbidden: {message}"),
        (false, true) => format!("{qualified} is forbidden: {message}"),
        (false, false) => format!("{qualified} {name:?} is forbidden: {message}"),
    };
    ApiError { details: Some(details), ..ApiError::new(403, "Forbidden", full) }
}

/// Authorizes one HTTP request of an authenticated user; the pods bound to a node are read from
/// the store when the answer depends on them.
pub async fn authorize_request(
    state: &ApiState,
    user: &UserInfo,
    method: &http::Method,
    path: &str,
    query: Option<&str>,
) -> ApiResult<()> {
    if identity(user) == Identity::Master {
        return Ok(());
    }
    let request = Request::parse(method, path, query);
    match decide(state, user, &request).await? {
        Decision::Allow => Ok(()),
        Decision::Deny(reason) => {
            tracing::debug!(user = %user.name, ?request, %reason, "forbidden");
            Err(forbidden(user, &request, &reason))
        }
    }
}

/// Decides whether `user` may make `request`, reading the pods bound to a node from the store
/// when the answer depends on them.
pub async fn decide(state: &ApiState, user: &UserInfo, request: &Request) -> ApiResult<Decision> {
    let graph = match (identity(user), request) {
        (Identity::Node(node), Request::Resource(r))
            if r.group.is_empty()
                && matches!(
                    r.resource.as_str(),
                    "secrets" | "configmaps" | "persistentvolumeclaims" | "serviceaccounts"
                )
                && !r.namespace.is_empty()
                && !r.name.is_empty() =>
        {
            // Most such reads are of what the node's pods reference: the index knows at once.
            if let Decision::Allow = authorize(user, request, &state.node_references.graph(node)) {
                return Ok(Decision::Allow);
            }
            PodReferences::load(state, node, &r.namespace).await?
        }
        _ => PodReferences::default(),
    };
    Ok(authorize(user, request, &graph))
}

// ---------------------------------------------------------------------------------------------
// The graph: what pods bound to a node reference

/// The secrets, configmaps and claims that pods bound to one node reference.
#[derive(Debug, Default)]
pub struct PodReferences {
    objects: HashSet<(Referenced, String, String)>,
}

impl NodeGraph for PodReferences {
    fn references(&self, kind: Referenced, namespace: &str, name: &str) -> bool {
        self.objects.contains(&(kind, namespace.to_string(), name.to_string()))
    }
}

impl PodReferences {
    /// What the pods bound to `node` in `namespace` reference (a pod references only objects
    /// of its own namespace), read from the store now.
    pub async fn load(state: &ApiState, node: &str, namespace: &str) -> ApiResult<Self> {
        let prefix = objects::prefix(&PODS, Some(namespace));
        let listed =
            state.store.list(&prefix, &ListOptions::default()).await.map_err(|e| ApiError::from_store(e, &PODS, ""))?;
        let mut refs = PodReferences::default();
        for kv in &listed.items {
            let obj = objects::decode_kv(&PODS, kv)?;
            // Most pods are elsewhere: check the node before decoding the whole pod.
            if obj.pointer("/spec/nodeName").and_then(Value::as_str) != Some(node) {
                continue;
            }
            match serde_json::from_value::<Pod>(obj) {
                Ok(pod) => refs.add_pod(&pod),
                Err(error) => tracing::warn!(key = %kv.key, %error, "cannot decode a stored pod"),
            }
        }
        Ok(refs)
    }

    /// Everything referenced, in no particular order.
    pub fn into_references(self) -> Vec<(Referenced, String, String)> {
        self.objects.into_iter().collect()
    }

    /// Adds what `pod` references, as `podutil.VisitPodSecretNames` and
    /// `VisitPodConfigmapNames` find it, and its claims.
    pub fn add_pod(&mut self, pod: &Pod) {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let Some(spec) = &pod.spec else { return };
        let mut add = |kind: Referenced, name: &str| {
            if !name.is_empty() {
                self.objects.insert((kind, namespace.clone(), name.to_string()));
            }
        };
        if let Some(sa) = &spec.service_account_name {
            add(Referenced::ServiceAccount, sa);
        }
        for secret in spec.image_pull_secrets.iter().flatten() {
            add(Referenced::Secret, &secret.name);
        }
        let mut env = |vars: Option<&Vec<EnvVar>>, sources: Option<&Vec<EnvFromSource>>| {
            for source in vars.into_iter().flatten().filter_map(|v| v.value_from.as_ref()) {
                if let Some(s) = &source.secret_key_ref {
                    add(Referenced::Secret, &s.name);
                }
                if let Some(c) = &source.config_map_key_ref {
                    add(Referenced::ConfigMap, &c.name);
                }
            }
            for source in sources.into_iter().flatten() {
                if let Some(s) = &source.secret_ref {
                    add(Referenced::Secret, &s.name);
                }
                if let Some(c) = &source.config_map_ref {
                    add(Referenced::ConfigMap, &c.name);
                }
            }
        };
        for c in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
            env(c.env.as_ref(), c.env_from.as_ref());
        }
        for c in spec.ephemeral_containers.iter().flatten() {
            env(c.env.as_ref(), c.env_from.as_ref());
        }
        for volume in spec.volumes.iter().flatten() {
            if let Some(s) = &volume.secret {
                add(Referenced::Secret, s.secret_name.as_deref().unwrap_or_default());
            }
            if let Some(c) = &volume.config_map {
                add(Referenced::ConfigMap, &c.name);
            }
            for source in volume.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
                if let Some(s) = &source.secret {
                    add(Referenced::Secret, &s.name);
                }
                if let Some(c) = &source.config_map {
                    add(Referenced::ConfigMap, &c.name);
                }
            }
            if let Some(claim) = &volume.persistent_volume_claim {
                add(Referenced::PersistentVolumeClaim, &claim.claim_name);
            }
            if volume.ephemeral.is_some() {
                add(Referenced::PersistentVolumeClaim, &format!("{pod_name}-{}", volume.name));
            }
            // Volume plugins that read credentials from a secret.
            let plugin_secrets = [
                volume.azure_file.as_ref().map(|v| v.secret_name.as_str()),
                volume.cephfs.as_ref().and_then(|v| v.secret_ref.as_ref()).map(|r| r.name.as_str()),
                volume.cinder.as_ref().and_then(|v| v.secret_ref.as_ref()).map(|r| r.name.as_str()),
                volume.flex_volume.as_ref().and_then(|v| v.secret_ref.as_ref()).map(|r| r.name.as_str()),
                volume.iscsi.as_ref().and_then(|v| v.secret_ref.as_ref()).map(|r| r.name.as_str()),
                volume.rbd.as_ref().and_then(|v| v.secret_ref.as_ref()).map(|r| r.name.as_str()),
                volume.scale_io.as_ref().map(|v| v.secret_ref.name.as_str()),
                volume.storageos.as_ref().and_then(|v| v.secret_ref.as_ref()).map(|r| r.name.as_str()),
                volume.csi.as_ref().and_then(|v| v.node_publish_secret_ref.as_ref()).map(|r| r.name.as_str()),
            ];
            for name in plugin_secrets.into_iter().flatten() {
                add(Referenced::Secret, name);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The request's user, for admission

tokio::task_local! {
    /// The authenticated user of the request being served.
    static REQUEST_USER: UserInfo;
}

/// Runs `fut` (the rest of a request) as `user`, so admission deep in the write path knows who
/// asks. Without a user (in-process tests, unauthenticated probes) nothing is restricted.
pub async fn serve_as<F: Future>(user: Option<UserInfo>, fut: F) -> F::Output {
    match user {
        Some(user) => REQUEST_USER.scope(user, fut).await,
        None => fut.await,
    }
}

/// Calls `f` with the user of the request being served, if there is one (`None` for requests
/// without authentication and for the server's own loops).
pub fn with_request_user<R>(f: impl FnOnce(Option<&UserInfo>) -> R) -> R {
    let user = REQUEST_USER.try_with(UserInfo::clone).ok();
    f(user.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo { name: name.into(), groups: groups.iter().map(|g| g.to_string()).collect(), ..Default::default() }
    }

    fn node_a() -> UserInfo {
        user("system:node:node-a", &["system:nodes", "system:authenticated"])
    }

    fn nothing_referenced(_: Referenced, _: &str, _: &str) -> bool {
        false
    }

    fn req(method: Method, path: &str) -> Request {
        let (path, query) = path.split_once('?').map_or((path, None), |(p, q)| (p, Some(q)));
        Request::parse(&method, path, query)
    }

    /// The decision for node-a with nothing referenced.
    fn as_node_a(method: Method, path: &str) -> Decision {
        authorize(&node_a(), &req(method, path), &nothing_referenced)
    }

    fn denied_message(user: &UserInfo, method: Method, path: &str, graph: &dyn NodeGraph) -> String {
        let request = req(method, path);
        match authorize(user, &request, graph) {
            Decision::Deny(reason) => forbidden(user, &request, &reason).message,
            Decision::Allow => panic!("{path} was allowed"),
        }
    }

    #[test]
    fn request_attributes_follow_kubernetes_request_info() {
        let Request::Resource(r) = req(Method::PATCH, "/api/v1/namespaces/default/pods/web/status") else {
            panic!("not a resource request");
        };
        assert_eq!(
            r,
            ResourceRequest {
                verb: "patch".into(),
                group: "".into(),
                version: "v1".into(),
                resource: "pods".into(),
                subresource: "status".into(),
                namespace: "default".into(),
                name: "web".into(),
            }
        );
        let Request::Resource(r) = req(
            Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases?watch=true&fieldSelector=metadata.name%3Dnode-a",
        ) else {
            panic!("not a resource request");
        };
        assert_eq!((r.verb.as_str(), r.name.as_str(), r.group.as_str()), ("watch", "node-a", "coordination.k8s.io"));
        let Request::Resource(r) = req(Method::GET, "/api/v1/namespaces/foo") else { panic!() };
        assert_eq!((r.resource.as_str(), r.namespace.as_str(), r.name.as_str()), ("namespaces", "foo", "foo"));
        let Request::Resource(r) = req(Method::PUT, "/api/v1/namespaces/foo/finalize") else { panic!() };
        assert_eq!((r.resource.as_str(), r.name.as_str(), r.subresource.as_str()), ("namespaces", "foo", "finalize"));
        let Request::Resource(r) = req(Method::DELETE, "/api/v1/namespaces/default/pods") else { panic!() };
        assert_eq!(r.verb, "deletecollection");
        let Request::Resource(r) = req(Method::GET, "/api/v1/nodes?fieldSelector=metadata.name!%3Dx") else { panic!() };
        assert_eq!((r.verb.as_str(), r.name.as_str()), ("list", ""));
        for discovery in ["/api", "/api/v1", "/apis", "/apis/apps", "/apis/apps/v1", "/version", "/metrics"] {
            assert!(matches!(req(Method::GET, discovery), Request::NonResource { .. }), "{discovery}");
        }
    }

    #[test]
    fn an_escaped_path_is_authorized_as_the_handler_will_read_it() {
        let Request::Resource(r) = req(Method::GET, "/api/v1/namespaces/default/secrets/s%65cret") else { panic!() };
        assert_eq!(r.name, "secret");
    }

    #[test]
    fn masters_may_do_anything_and_other_users_anything_but_token_reviews() {
        let admin = user("admin", &["system:masters", "system:authenticated"]);
        let alice = user("alice", &["dev", "system:authenticated"]);
        for u in [&admin, &alice] {
            for path in ["/api/v1/nodes/node-b", "/apis/apps/v1/namespaces/x/deployments/d", "/metrics"] {
                assert_eq!(authorize(u, &req(Method::PATCH, path), &nothing_referenced), Decision::Allow);
            }
        }
        let review = req(Method::POST, "/apis/authentication.k8s.io/v1/tokenreviews");
        assert_eq!(authorize(&admin, &review, &nothing_referenced), Decision::Allow);
        assert_eq!(authorize(&node_a(), &review, &nothing_referenced), Decision::Allow);
        assert_eq!(
            denied_message(&alice, Method::POST, "/apis/authentication.k8s.io/v1/tokenreviews", &nothing_referenced),
            "tokenreviews.authentication.k8s.io is forbidden: User \"alice\" cannot create resource \"tokenreviews\" in API group \"authentication.k8s.io\" at the cluster scope"
        );
    }

    #[test]
    fn a_master_in_the_nodes_group_is_still_a_master() {
        let both = user("system:node:x", &["system:nodes", "system:masters"]);
        assert_eq!(identity(&both), Identity::Master);
    }

    #[test]
    fn a_nodes_group_member_without_a_node_name_may_only_discover() {
        let nameless = user("kubelet", &["system:nodes", "system:authenticated"]);
        assert_eq!(identity(&nameless), Identity::UnknownNode);
        assert_eq!(authorize(&nameless, &req(Method::GET, "/apis"), &nothing_referenced), Decision::Allow);
        assert_eq!(
            denied_message(&nameless, Method::GET, "/api/v1/nodes", &nothing_referenced),
            "nodes is forbidden: User \"kubelet\" cannot list resource \"nodes\" in API group \"\" at the cluster scope: unknown node for user \"kubelet\""
        );
    }

    #[test]
    fn a_node_may_read_discovery_but_not_metrics() {
        for path in ["/api", "/api/v1", "/apis", "/apis/node.k8s.io/v1", "/openapi/v3", "/version", "/healthz"] {
            assert_eq!(as_node_a(Method::GET, path), Decision::Allow, "{path}");
        }
        assert_eq!(
            denied_message(&node_a(), Method::GET, "/metrics", &nothing_referenced),
            "forbidden: User \"system:node:node-a\" cannot get path \"/metrics\""
        );
        assert_eq!(as_node_a(Method::POST, "/api"), deny(""));
    }

    #[test]
    fn a_node_may_read_every_node_and_write_nodes_subject_to_admission() {
        for (method, path) in [
            (Method::GET, "/api/v1/nodes"),
            (Method::GET, "/api/v1/nodes?watch=1"),
            (Method::GET, "/api/v1/nodes/node-b"),
            (Method::POST, "/api/v1/nodes"),
            (Method::PUT, "/api/v1/nodes/node-a"),
            (Method::PATCH, "/api/v1/nodes/node-a/status"),
            (Method::DELETE, "/api/v1/nodes/node-a"),
        ] {
            assert_eq!(as_node_a(method.clone(), path), Decision::Allow, "{method} {path}");
        }
        assert_eq!(
            denied_message(&node_a(), Method::DELETE, "/api/v1/nodes", &nothing_referenced),
            "nodes is forbidden: User \"system:node:node-a\" cannot deletecollection resource \"nodes\" in API group \"\" at the cluster scope"
        );
        assert_eq!(as_node_a(Method::GET, "/api/v1/nodes/node-a/proxy"), deny(""));
    }

    #[test]
    fn a_node_may_read_pods_write_status_and_delete_but_not_update_a_spec_or_exec() {
        for (method, path) in [
            (Method::GET, "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a"),
            (Method::GET, "/api/v1/namespaces/default/pods/web"),
            (Method::PATCH, "/api/v1/namespaces/default/pods/web/status"),
            (Method::PUT, "/api/v1/namespaces/default/pods/web/status"),
            (Method::DELETE, "/api/v1/namespaces/default/pods/web"),
            (Method::POST, "/api/v1/namespaces/default/pods"),
        ] {
            assert_eq!(as_node_a(method.clone(), path), Decision::Allow, "{method} {path}");
        }
        assert_eq!(
            denied_message(&node_a(), Method::PATCH, "/api/v1/namespaces/default/pods/web", &nothing_referenced),
            "pods \"web\" is forbidden: User \"system:node:node-a\" cannot patch resource \"pods\" in API group \"\" in the namespace \"default\""
        );
        for sub in ["exec", "log", "attach", "portforward", "binding"] {
            let path = format!("/api/v1/namespaces/default/pods/web/{sub}");
            assert_eq!(as_node_a(Method::POST, &path), deny(""), "{sub}");
            assert_eq!(as_node_a(Method::GET, &path), deny(""), "{sub}");
        }
    }

    #[test]
    fn proxy_requests_are_authorized_by_method_on_the_proxy_subresource_and_never_for_a_node() {
        for (method, verb) in
            [(Method::GET, "get"), (Method::POST, "create"), (Method::PUT, "update"), (Method::DELETE, "delete")]
        {
            let Request::Resource(r) = req(method.clone(), "/api/v1/namespaces/default/pods/web:8080/proxy/a/b?x=1")
            else {
                panic!("not a resource request");
            };
            assert_eq!(
                (r.verb.as_str(), r.resource.as_str(), r.subresource.as_str(), r.name.as_str()),
                (verb, "pods", "proxy", "web:8080")
            );
            for path in ["/api/v1/namespaces/default/pods/web/proxy/", "/api/v1/namespaces/default/services/s:80/proxy"]
            {
                assert_eq!(as_node_a(method.clone(), path), deny(""), "{method} {path}");
            }
        }
        assert_eq!(
            denied_message(&node_a(), Method::GET, "/api/v1/namespaces/default/pods/web/proxy/x", &nothing_referenced),
            "pods \"web\" is forbidden: User \"system:node:node-a\" cannot get resource \"pods/proxy\" in API group \"\" in the namespace \"default\""
        );
    }

    #[test]
    fn a_node_reads_only_secrets_and_configmaps_its_pods_reference() {
        let graph = |kind: Referenced, ns: &str, name: &str| {
            (kind, ns, name) == (Referenced::Secret, "default", "mounted")
                || (kind, ns, name) == (Referenced::ConfigMap, "default", "settings")
        };
        let node = node_a();
        let allowed = |method: Method, path: &str| authorize(&node, &req(method, path), &graph);
        assert_eq!(allowed(Method::GET, "/api/v1/namespaces/default/secrets/mounted"), Decision::Allow);
        assert_eq!(allowed(Method::GET, "/api/v1/namespaces/default/configmaps/settings"), Decision::Allow);
        assert_eq!(
            allowed(Method::GET, "/api/v1/namespaces/default/secrets?fieldSelector=metadata.name%3Dmounted&watch=true"),
            Decision::Allow
        );
        // Same name, other kind or namespace: not referenced.
        assert_eq!(
            denied_message(&node, Method::GET, "/api/v1/namespaces/default/configmaps/mounted", &graph),
            "configmaps \"mounted\" is forbidden: User \"system:node:node-a\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"default\": no relationship found between node 'node-a' and this object"
        );
        assert_eq!(
            allowed(Method::GET, "/api/v1/namespaces/other/secrets/mounted"),
            deny("no relationship found between node 'node-a' and this object")
        );
        assert_eq!(allowed(Method::GET, "/api/v1/namespaces/default/secrets"), deny("No Object name found"));
        assert_eq!(allowed(Method::GET, "/api/v1/secrets"), deny("can only read namespaced object of this type"));
        assert_eq!(
            allowed(Method::PUT, "/api/v1/namespaces/default/secrets/mounted"),
            deny("can only read resources of this type")
        );
        assert_eq!(
            allowed(Method::POST, "/api/v1/namespaces/default/secrets"),
            deny("can only read resources of this type")
        );
    }

    #[test]
    fn a_node_may_use_only_its_own_lease_in_the_node_lease_namespace() {
        let base = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
        for (method, path) in [
            (Method::GET, format!("{base}/node-a")),
            (Method::PUT, format!("{base}/node-a")),
            (Method::PATCH, format!("{base}/node-a")),
            (Method::DELETE, format!("{base}/node-a")),
            (Method::POST, base.to_string()),
            (Method::GET, format!("{base}?fieldSelector=metadata.name%3Dnode-a")),
        ] {
            assert_eq!(as_node_a(method.clone(), &path), Decision::Allow, "{method} {path}");
        }
        assert_eq!(
            denied_message(&node_a(), Method::PUT, &format!("{base}/node-b"), &nothing_referenced),
            "leases.coordination.k8s.io \"node-b\" is forbidden: User \"system:node:node-a\" cannot update resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"kube-node-lease\": can only access node lease with the same name as the requesting node"
        );
        assert_eq!(as_node_a(Method::GET, base), deny("can only get, create, update, patch, or delete a node lease"));
        assert_eq!(
            as_node_a(Method::GET, "/apis/coordination.k8s.io/v1/namespaces/default/leases/node-a"),
            deny("can only access leases in the \"kube-node-lease\" system namespace")
        );
    }

    #[test]
    fn a_node_may_create_tokens_only_for_service_accounts_of_its_pods() {
        let graph = |kind: Referenced, ns: &str, name: &str| {
            (kind, ns, name) == (Referenced::ServiceAccount, "default", "robot")
        };
        let token = |name: &str| req(Method::POST, &format!("/api/v1/namespaces/default/serviceaccounts/{name}/token"));
        assert_eq!(authorize(&node_a(), &token("robot"), &graph), Decision::Allow);
        assert_eq!(
            authorize(&node_a(), &token("other"), &graph),
            deny("no relationship found between node 'node-a' and this object")
        );
        let get = req(Method::GET, "/api/v1/namespaces/default/serviceaccounts/robot");
        assert_eq!(authorize(&node_a(), &get, &graph), deny("can only create tokens for individual service accounts"));
        let mut pods = PodReferences::default();
        pods.add_pod(&pod("node-a", json!({"serviceAccountName": "robot", "containers": []})));
        assert!(pods.references(Referenced::ServiceAccount, "ns", "robot"));
    }

    #[test]
    fn a_node_may_write_events_and_read_runtime_classes_but_nothing_else() {
        for (method, path) in [
            (Method::POST, "/api/v1/namespaces/default/events"),
            (Method::PATCH, "/api/v1/namespaces/default/events/e1"),
            (Method::POST, "/apis/events.k8s.io/v1/namespaces/default/events"),
            (Method::GET, "/apis/node.k8s.io/v1/runtimeclasses"),
            (Method::GET, "/apis/node.k8s.io/v1/runtimeclasses/gvisor"),
            (Method::GET, "/api/v1/namespaces"),
            (Method::GET, "/api/v1/namespaces/default/services"),
            (Method::GET, "/apis/discovery.k8s.io/v1/endpointslices"),
        ] {
            assert_eq!(as_node_a(method.clone(), path), Decision::Allow, "{method} {path}");
        }
        for (method, path) in [
            (Method::GET, "/api/v1/namespaces/default/events"),
            (Method::POST, "/apis/node.k8s.io/v1/runtimeclasses"),
            (Method::DELETE, "/api/v1/namespaces/default"),
            (Method::POST, "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"),
        ] {
            assert_eq!(as_node_a(method.clone(), path), deny(""), "{method} {path}");
        }
        assert_eq!(
            as_node_a(Method::GET, "/api/v1/namespaces/default/serviceaccounts"),
            deny("can only create tokens for individual service accounts")
        );
        assert_eq!(
            denied_message(
                &node_a(),
                Method::POST,
                "/apis/apps/v1/namespaces/default/deployments",
                &nothing_referenced
            ),
            "deployments.apps is forbidden: User \"system:node:node-a\" cannot create resource \"deployments\" in API group \"apps\" in the namespace \"default\""
        );
    }

    #[test]
    fn forbidden_statuses_carry_kubernetes_details() {
        let request = req(Method::PATCH, "/api/v1/nodes/node-b");
        let error = forbidden(&node_a(), &request, "why");
        assert_eq!((error.code, error.reason), (403, "Forbidden"));
        assert_eq!(error.details, Some(json!({"name": "node-b", "kind": "nodes"})));
        let request = req(Method::GET, "/apis/apps/v1/deployments");
        assert_eq!(forbidden(&node_a(), &request, "").details, Some(json!({"group": "apps", "kind": "deployments"})));
    }

    fn pod(node: &str, spec: Value) -> Pod {
        let mut spec = spec;
        spec["nodeName"] = json!(node);
        if spec.get("containers").is_none() {
            spec["containers"] = json!([{"name": "c", "image": "busybox"}]);
        }
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "ns"}, "spec": spec})).unwrap()
    }

    #[test]
    fn pod_references_cover_volumes_env_pull_secrets_projections_and_claims() {
        let mut refs = PodReferences::default();
        refs.add_pod(&pod(
            "node-a",
            json!({
                "imagePullSecrets": [{"name": "pull"}],
                "containers": [{"name": "c", "image": "i",
                    "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "env-secret", "key": "k"}}},
                            {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "env-cm", "key": "k"}}}],
                    "envFrom": [{"secretRef": {"name": "from-secret"}}, {"configMapRef": {"name": "from-cm"}}]}],
                "initContainers": [{"name": "i", "image": "i", "envFrom": [{"secretRef": {"name": "init-secret"}}]}],
                "volumes": [
                    {"name": "s", "secret": {"secretName": "vol-secret"}},
                    {"name": "c", "configMap": {"name": "vol-cm"}},
                    {"name": "p", "projected": {"sources": [{"secret": {"name": "proj-secret"}}, {"configMap": {"name": "proj-cm"}}]}},
                    {"name": "claim", "persistentVolumeClaim": {"claimName": "data"}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                    {"name": "csi", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "csi-secret"}}}
                ]
            }),
        ));
        for secret in ["pull", "env-secret", "from-secret", "init-secret", "vol-secret", "proj-secret", "csi-secret"] {
            assert!(refs.references(Referenced::Secret, "ns", secret), "{secret}");
        }
        for cm in ["env-cm", "from-cm", "vol-cm", "proj-cm"] {
            assert!(refs.references(Referenced::ConfigMap, "ns", cm), "{cm}");
        }
        assert!(refs.references(Referenced::PersistentVolumeClaim, "ns", "data"));
        assert!(refs.references(Referenced::PersistentVolumeClaim, "ns", "web-scratch"));
        assert!(!refs.references(Referenced::ConfigMap, "ns", "vol-secret"));
        assert!(!refs.references(Referenced::Secret, "other", "vol-secret"));
    }
}
