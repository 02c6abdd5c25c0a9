//! kube-scheduler's filter and score plugins of the default profile, one module per plugin with
//! its reason strings, and berth's RuntimeClass filter.

pub mod image_locality;
pub mod inter_pod_affinity;
pub mod node_affinity;
pub mod node_name;
pub mod node_ports;
pub mod node_resources;
pub mod node_unschedulable;
pub mod pod_topology_spread;
pub mod runtime_class;
pub mod taint_toleration;
