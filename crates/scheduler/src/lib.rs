//! Places pending pods on nodes: Kubernetes' filters and scores plus RuntimeClass support, through the Kubernetes API.
//!
//! A pure core decides: [`pod_info`] and [`node_info`] hold what the plugins read, [`plugins`]
//! are kube-scheduler's filter and score plugins with their reason strings (and berth's
//! RuntimeClass filter), [`algorithm`] picks a node for one pod, [`cache`] keeps nodes with the
//! pods bound or assumed on them, and [`queue`] orders pending pods with back-off. The shell
//! ([`scheduler`]) feeds the core from API watches, binds through `pods/binding` and reports
//! failures as pod conditions and events; it talks to the control plane only through `kube`, so it
//! runs against any Kubernetes API server.

pub mod algorithm;
pub mod cache;
pub mod framework;
pub mod metrics;
pub mod node_info;
pub mod node_selector;
pub mod plugins;
pub mod pod_info;
pub mod queue;
pub mod resources;
pub mod scheduler;
pub mod taints;
