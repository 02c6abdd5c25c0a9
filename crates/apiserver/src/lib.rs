//! Kubernetes-compatible REST API over the berth store: discovery, verbs, watch, admission, authentication.
