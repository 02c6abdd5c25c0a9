//! Kubernetes-compatible REST API over the berth store: discovery, verbs, watch, admission, authentication.

pub mod authn;
pub mod tls;
