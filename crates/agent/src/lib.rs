//! The node agent: pods bound to this node run through several CRI runtimes, chosen by RuntimeClass.
//!
//! It talks to the control plane only through the Kubernetes API (`kube`) and to runtimes only
//! through CRI gRPC, so it drives berth's runtime and containerd alike (seed `002_…`).

pub mod agent;
pub mod config;
pub mod endpoint;
pub mod http;
pub mod network;
pub mod node;
pub mod pods;
pub mod runtimes;
