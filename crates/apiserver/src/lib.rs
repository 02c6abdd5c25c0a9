//! Kubernetes-compatible REST API over the berth store: discovery, verbs, watch, admission,
//! authentication and node authorization.
//!
//! [`router`] builds the whole API as one axum `Router` (a tower `Service`), so tests can hand it
//! straight to a `kube::Client`; [`server::run`] serves it over TLS with bearer-token auth.

pub mod accessreview;
pub mod admission;
pub mod authn;
pub mod authz;
pub mod delete;
pub mod discovery;
pub mod error;
pub mod handlers;
pub mod http_proxy;
pub mod lifecycle;
mod list_stream;
pub mod memory;
pub mod metrics;
pub mod negotiation;
pub mod node_graph;
pub mod objects;
pub mod openapi;
pub mod protobuf;
pub mod proxy;
pub mod request;
pub mod satoken;
pub mod server;
pub mod server_leases;
pub mod services;
pub mod tls;
pub mod tokenrequest;
pub mod tokenreview;
pub mod watch;
pub mod watch_events;
pub mod watch_hub;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use berth_store::Store;

pub use error::{ApiError, ApiResult};

/// Bodies above this size get 413, as Kubernetes' 3 MiB request limit.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// The Kubernetes version this API serves (k8s-openapi's types are 1.33).
pub const KUBE_MAJOR: &str = "1";
pub const KUBE_MINOR: &str = "33";
pub const KUBE_GIT_VERSION: &str = "v1.33.0+berth";

/// Everything a request handler needs.
pub struct ApiState {
    pub store: Arc<dyn Store>,
    /// `None` serves every request as admin: for in-process tests only.
    pub authenticator: Option<authn::TokenAuthenticator>,
    pub metrics: metrics::Metrics,
    /// Settings of the admission chain.
    pub admission: admission::Admission,
    /// Where Services get their cluster IPs and node ports.
    pub services: services::ServiceNetwork,
    /// Signs and verifies service account tokens; `None`: TokenRequest is unavailable.
    pub service_account_tokens: Option<satoken::TokenKeys>,
    /// Watch events decoded once for every watcher.
    pub watch_events: watch_events::SharedEvents,
    /// One store watch per watched resource type, fanned out to its watchers.
    pub watch_hub: watch_hub::WatchHub,
    /// What each node's pods reference, for the node authorizer (kept by [`node_graph::run`]).
    pub node_references: node_graph::NodeReferences,
}

impl ApiState {
    /// A state with the admission chain's defaults.
    pub fn new(store: Arc<dyn Store>, authenticator: Option<authn::TokenAuthenticator>) -> Arc<Self> {
        Self::with_admission(store, authenticator, admission::Admission::default())
    }

    pub fn with_admission(
        store: Arc<dyn Store>,
        authenticator: Option<authn::TokenAuthenticator>,
        admission: admission::Admission,
    ) -> Arc<Self> {
        Self::with_services(store, authenticator, admission, services::ServiceNetwork::default())
    }

    pub fn with_services(
        store: Arc<dyn Store>,
        authenticator: Option<authn::TokenAuthenticator>,
        admission: admission::Admission,
        services: services::ServiceNetwork,
    ) -> Arc<Self> {
        Self::with_service_account_tokens(store, authenticator, admission, services, None)
    }

    pub fn with_service_account_tokens(
        store: Arc<dyn Store>,
        authenticator: Option<authn::TokenAuthenticator>,
        admission: admission::Admission,
        services: services::ServiceNetwork,
        service_account_tokens: Option<satoken::TokenKeys>,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            authenticator,
            metrics: metrics::Metrics::new(),
            admission,
            services,
            service_account_tokens,
            watch_events: watch_events::SharedEvents::default(),
            watch_hub: watch_hub::WatchHub::default(),
            node_references: node_graph::NodeReferences::default(),
        })
    }
}

/// The whole API as one service.
pub fn router(state: Arc<ApiState>) -> Router {
    Router::new()
        .route("/version", get(discovery::version))
        .route("/healthz", get(discovery::healthz))
        .route("/livez", get(discovery::healthz))
        .route("/readyz", get(discovery::readyz))
        .route("/.well-known/openid-configuration", get(discovery::openid_configuration))
        .route("/openid/v1/jwks", get(discovery::openid_jwks))
        .route("/metrics", get(metrics::serve))
        .route("/api", get(discovery::api_versions))
        .route("/api/", get(discovery::api_versions))
        .route("/apis", get(discovery::api_groups))
        .route("/apis/", get(discovery::api_groups))
        .route("/openapi/v2", get(openapi::v2))
        .route("/openapi/v3", get(openapi::v3_index))
        .route("/openapi/v3/{*path}", get(openapi::v3_document))
        .route("/api/v1", get(discovery::core_resources))
        .route("/api/v1/namespaces/{namespace}/pods/{name}/log", get(proxy::log))
        .route("/api/v1/namespaces/{namespace}/pods/{name}/exec", get(proxy::exec).post(proxy::exec))
        .route("/api/v1/namespaces/{namespace}/pods/{name}/attach", get(proxy::attach).post(proxy::attach))
        .route(
            "/api/v1/namespaces/{namespace}/pods/{name}/portforward",
            get(proxy::portforward).post(proxy::portforward),
        )
        .route("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", any(tokenrequest::serve))
        .route("/api/v1/namespaces/{namespace}/pods/{name}/proxy", any(http_proxy::pod))
        .route("/api/v1/namespaces/{namespace}/pods/{name}/proxy/", any(http_proxy::pod))
        .route("/api/v1/namespaces/{namespace}/pods/{name}/proxy/{*path}", any(http_proxy::pod))
        .route("/api/v1/namespaces/{namespace}/services/{name}/proxy", any(http_proxy::service))
        .route("/api/v1/namespaces/{namespace}/services/{name}/proxy/", any(http_proxy::service))
        .route("/api/v1/namespaces/{namespace}/services/{name}/proxy/{*path}", any(http_proxy::service))
        .route("/api/v1/{*rest}", any(handlers::core_entry))
        .route("/apis/authentication.k8s.io/v1/tokenreviews", any(tokenreview::serve))
        .route("/apis/authentication.k8s.io/v1/selfsubjectreviews", any(accessreview::self_subject))
        .route("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", any(accessreview::self_subject_access))
        .route("/apis/authorization.k8s.io/v1/subjectaccessreviews", any(accessreview::subject_access))
        .route(
            "/apis/authorization.k8s.io/v1/namespaces/{namespace}/localsubjectaccessreviews",
            any(accessreview::local_subject_access),
        )
        .route("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", any(accessreview::self_subject_rules))
        .route("/apis/{group}", get(discovery::group))
        .route("/apis/{group}/", get(discovery::group))
        .route("/apis/{group}/{version}", get(discovery::group_resources))
        .route("/apis/{group}/{version}/{*rest}", any(handlers::group_entry))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .layer(DefaultBodyLimit::disable())
        .layer(middleware::from_fn(negotiation::encode))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(404, "NotFound", "the server could not find the requested resource")
}

/// Rejects requests without a valid bearer token (401), except health probes, as Kubernetes'
/// default anonymous access to `/healthz`, `/livez`, `/readyz` and `/version`; then authorizes
/// the user's request (403) and serves it as that user, for admission.
async fn authenticate(State(state): State<Arc<ApiState>>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let public = matches!(path, "/healthz" | "/livez" | "/readyz" | "/version");
    let mut user = None;
    if let Some(auth) = &state.authenticator {
        let header = req.headers().get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let mut found = auth.authenticate(header);
        if found.is_none()
            && let Some(token) = header.and_then(authn::bearer_token)
        {
            found = satoken::authenticate(&state, token).await;
        }
        match found {
            Some(known) => {
                if let Err(e) =
                    authz::authorize_request(&state, &known, req.method(), req.uri().path(), req.uri().query()).await
                {
                    return e.into_response();
                }
                req.extensions_mut().insert(known.clone());
                user = Some(known);
            }
            None if public => {}
            None => return ApiError::unauthorized().into_response(),
        }
    }
    authz::serve_as(user, next.run(req)).await
}
