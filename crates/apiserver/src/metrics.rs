//! Prometheus metrics of the API server: requests by verb/resource/code, latencies, store
//! operations and open watches, served at `/metrics` in the text format.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::IntoResponse;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::ApiState;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: String,
    resource: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbLabels {
    verb: String,
    resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabels {
    resource: String,
}

fn latency_histogram() -> Histogram {
    // 50 µs .. ~26 s
    Histogram::new(exponential_buckets(0.00005, 2.0, 20))
}

pub struct Metrics {
    /// The root registry: the API server's series under `apiserver_`, and what other parts
    /// running in the same process add with [`Metrics::register`].
    registry: std::sync::Mutex<Registry>,
    requests: Family<RequestLabels, Counter>,
    request_seconds: Family<VerbLabels, Histogram, fn() -> Histogram>,
    store_seconds: Family<OpLabels, Histogram, fn() -> Histogram>,
    watchers: Family<ResourceLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("apiserver");
        let requests = Family::<RequestLabels, Counter>::default();
        let request_seconds =
            Family::<VerbLabels, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        let store_seconds = Family::<OpLabels, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        let watchers = Family::<ResourceLabels, Gauge>::default();
        registry.register("request", "API requests by verb, resource and HTTP code", requests.clone());
        registry.register(
            "request_duration_seconds",
            "API request latency by verb and resource",
            request_seconds.clone(),
        );
        registry.register("storage_operation_duration_seconds", "Store operation latency", store_seconds.clone());
        registry.register("registered_watchers", "Open watches by resource", watchers.clone());
        Self { registry: std::sync::Mutex::new(root), requests, request_seconds, store_seconds, watchers }
    }

    pub fn observe_request(&self, verb: &str, resource: &str, code: u16, took: Duration) {
        self.requests
            .get_or_create(&RequestLabels { verb: verb.into(), resource: resource.into(), code: code.to_string() })
            .inc();
        self.request_seconds
            .get_or_create(&VerbLabels { verb: verb.into(), resource: resource.into() })
            .observe(took.as_secs_f64());
    }

    pub fn observe_store(&self, op: &str, took: Duration) {
        self.store_seconds.get_or_create(&OpLabels { operation: op.into() }).observe(took.as_secs_f64());
    }

    pub fn watchers(&self, resource: &str, delta: i64) {
        self.watchers.get_or_create(&ResourceLabels { resource: resource.into() }).inc_by(delta);
    }

    /// Lets a part running in the server's process (the scheduler, the controllers) serve its
    /// metrics on the server's `/metrics`.
    pub fn register(&self, add: impl FnOnce(&mut Registry)) {
        add(&mut self.registry.lock().unwrap_or_else(|e| e.into_inner()));
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("writing to a String cannot fail");
        out
    }
}

pub async fn serve(State(state): State<Arc<ApiState>>) -> impl IntoResponse {
    ([(http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], state.metrics.render())
}
