//! The controllers of the control plane (ReplicaSet, ReplicationController, Deployment, garbage collector,
//! node lifecycle, node IPAM, namespace, EndpointSlice, EndpointSlice mirroring, Endpoints, ServiceAccount, root CA publisher),
//! through the Kubernetes API only.
//!
//! Each controller is one module with a `run(ctx)` that works until its future is dropped, built
//! on kube's controller runtime (reflectors, `Controller`, reconcile → `Action`), with its
//! arithmetic in pure functions beside it. The controllers that read pods share one cache of them
//! ([`pod_cache`], reached through [`Context::pods`]), as kube-controller-manager's share one pod
//! informer. They reach the control plane only through the API, so `berth controller-manager`
//! runs them against any Kubernetes API server, and `berth server` runs them in-process. [`enabled`] reads kube-controller-manager's `--controllers` syntax.

pub mod deployment;
pub mod endpoints;
pub mod garbage_collector;
pub mod namespace;
pub mod node_ipam;
pub mod node_lifecycle;
pub(crate) mod per_namespace;
pub mod pod_cache;
pub mod replicaset;
pub mod replication;
pub mod root_ca_publisher;
pub mod serviceaccount;
pub(crate) mod workloads;

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use berth_events::{Recorder, Source};

/// The component events are reported as.
pub const COMPONENT: &str = "controller-manager";
/// Events waiting to be written beyond this many are dropped.
const EVENT_QUEUE: usize = 1000;

/// Every controller, by the names kube-controller-manager's `--controllers` flag uses.
pub const CONTROLLERS: &[&str] = &[
    "replicaset",
    "replicationcontroller",
    "deployment",
    "garbagecollector",
    "nodelifecycle",
    "nodeipam",
    "namespace",
    "endpointslice",
    "endpoint",
    "endpointslicemirroring",
    "serviceaccount",
    "root-ca-cert-publisher",
];

/// kube-controller-manager's long names that are not a controller's name with `-controller`
/// added, as [`enabled`] compares them (dashes dropped), with the controller they name.
const ALIASES: &[(&str, &str)] = &[("rootcacertificatepublisher", "root-ca-cert-publisher")];

/// Settings of the controllers (kube-controller-manager's flags and defaults).
#[derive(Clone, Debug)]
pub struct Config {
    /// A node whose Lease is not renewed for this long is unreachable (`--node-monitor-grace-period`).
    pub node_monitor_grace_period: Duration,
    /// How often node health is checked (`--node-monitor-period`).
    pub node_monitor_period: Duration,
    /// Nodes whose pods are evicted per second (`--node-eviction-rate`).
    pub node_eviction_rate: f64,
    /// The cluster's CA bundle (PEM) that the root CA publisher puts in every namespace
    /// (`--root-ca-file`); without it the publisher does not run.
    pub root_ca: Option<String>,
    /// Whether Nodes get pod CIDRs from `cluster_cidr` (`--allocate-node-cidrs`); without it the
    /// node IPAM controller does not run.
    pub allocate_node_cidrs: bool,
    /// The range node pod CIDRs are cut from (`--cluster-cidr`).
    pub cluster_cidr: node_ipam::Ipv4Net,
    /// The prefix length of each node's block (`--node-cidr-mask-size`).
    pub node_cidr_mask_size: u8,
}

/// The cluster CIDR when none is given, as kubeadm and flannel use it.
pub const DEFAULT_CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The node CIDR mask size when none is given, as kube-controller-manager's for IPv4.
pub const DEFAULT_NODE_CIDR_MASK_SIZE: u8 = 24;

impl Default for Config {
    fn default() -> Self {
        Config {
            node_monitor_grace_period: Duration::from_secs(50),
            node_monitor_period: Duration::from_secs(5),
            node_eviction_rate: 0.1,
            root_ca: None,
            allocate_node_cidrs: false,
            cluster_cidr: DEFAULT_CLUSTER_CIDR.parse().expect("the default cluster CIDR parses"),
            node_cidr_mask_size: DEFAULT_NODE_CIDR_MASK_SIZE,
        }
    }
}

/// What every controller gets.
pub struct Context {
    pub client: kube::Client,
    pub config: Config,
    pub recorder: Recorder,
    /// Started by the first controller that reads pods, so the others do not pay for it.
    pods: OnceLock<pod_cache::PodCache>,
}

impl Context {
    pub fn new(client: kube::Client, config: Config) -> Arc<Context> {
        let recorder = Recorder::spawn(client.clone(), Source { component: COMPONENT.into(), host: None }, EVENT_QUEUE);
        Arc::new(Context { client, config, recorder, pods: OnceLock::new() })
    }

    /// The pod cache the controllers share; its watch starts at the first call.
    pub fn pods(&self) -> &pod_cache::PodCache {
        self.pods.get_or_init(|| pod_cache::PodCache::start(self.client.clone()))
    }
}

/// The controllers `--controllers` names: `*` is all of them, `name` adds one, `-name` removes
/// one (later entries win), as kube-controller-manager reads it; names may carry its
/// `-controller` suffix (`replicaset-controller`, `garbage-collector-controller`), and dashes
/// are not significant (`root-ca-cert-publisher`, `rootcacertpublisher`).
pub fn enabled(spec: &[String]) -> Result<BTreeSet<&'static str>, String> {
    let mut on = BTreeSet::new();
    for item in spec.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let (remove, name) = match item.strip_prefix('-') {
            Some(name) => (true, name),
            None => (false, item),
        };
        let names: Vec<&'static str> = if name == "*" {
            CONTROLLERS.to_vec()
        } else {
            let bare = name.strip_suffix("-controller").unwrap_or(name).replace('-', "");
            let bare = ALIASES.iter().find(|(long, _)| *long == bare).map_or(bare, |(_, c)| c.replace('-', ""));
            match CONTROLLERS.iter().find(|c| c.replace('-', "") == bare) {
                Some(c) => vec![*c],
                None => {
                    return Err(format!(
                        "{name:?} is not a known controller; known controllers: {}",
                        CONTROLLERS.join(", ")
                    ));
                }
            }
        };
        for n in names {
            if remove {
                on.remove(n);
            } else {
                on.insert(n);
            }
        }
    }
    Ok(on)
}

/// Drives a controller's applier to its end, logging what goes wrong outside reconciling: failed
/// syncs are reported by each controller's error policy, and objects gone meanwhile are fine.
pub(crate) async fn log_failures<T, R, Q>(
    results: impl futures::Stream<Item = Result<T, kube::runtime::controller::Error<R, Q>>>,
    controller: &str,
) where
    R: std::error::Error + 'static,
    Q: std::error::Error + 'static,
{
    use futures::StreamExt;
    use kube::runtime::controller::Error;
    let mut results = std::pin::pin!(results);
    while let Some(result) = results.next().await {
        match result {
            Err(Error::QueueError(e)) => tracing::warn!(error = %e, controller, "watch failed"),
            Ok(_) | Err(Error::ReconcilerFailed(..)) | Err(Error::ObjectNotFound(_)) => {}
            Err(other) => tracing::warn!(error = %other, controller, "controller"),
        }
    }
}

/// Runs the `enabled` controllers until the future is dropped.
pub async fn run(ctx: Arc<Context>, enabled: &BTreeSet<&'static str>) {
    let mut tasks = tokio::task::JoinSet::new();
    for name in enabled {
        let ctx = ctx.clone();
        match *name {
            "replicaset" => tasks.spawn(replicaset::run(ctx)),
            "replicationcontroller" => tasks.spawn(replication::run(ctx)),
            "deployment" => tasks.spawn(deployment::run(ctx)),
            "garbagecollector" => tasks.spawn(garbage_collector::run(ctx)),
            "nodelifecycle" => tasks.spawn(node_lifecycle::run(ctx)),
            "nodeipam" if !ctx.config.allocate_node_cidrs => {
                tracing::info!(controller = name, "--allocate-node-cidrs is off: controller not started");
                continue;
            }
            "nodeipam" => tasks.spawn(node_ipam::run(ctx)),
            "namespace" => tasks.spawn(namespace::run(ctx)),
            "endpointslice" => tasks.spawn(endpoints::run_endpoint_slices(ctx)),
            "endpoint" => tasks.spawn(endpoints::run_endpoints(ctx)),
            "endpointslicemirroring" => tasks.spawn(endpoints::mirroring::run(ctx)),
            "serviceaccount" => tasks.spawn(serviceaccount::run(ctx)),
            "root-ca-cert-publisher" => match ctx.config.root_ca.clone() {
                Some(ca) => tasks.spawn(root_ca_publisher::run(ctx, ca)),
                None => {
                    tracing::info!(controller = name, "no root CA bundle (--root-ca-file): controller not started");
                    continue;
                }
            },
            _ => continue,
        };
        tracing::info!(controller = name, "controller started");
    }
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> Vec<String> {
        s.split(',').map(String::from).collect()
    }

    #[test]
    fn star_enables_all_and_a_dash_removes_one() {
        let on = enabled(&spec("*,-deployment")).unwrap();
        assert!(!on.contains("deployment"));
        assert_eq!(on.len(), CONTROLLERS.len() - 1);
        assert!(enabled(&spec("-*")).unwrap().is_empty());
        assert_eq!(enabled(&spec("-*,replicaset")).unwrap().into_iter().collect::<Vec<_>>(), vec!["replicaset"]);
    }

    #[test]
    fn kube_controller_manager_long_names_are_accepted() {
        let on =
            enabled(&spec("replicaset-controller,garbage-collector-controller,node-lifecycle-controller")).unwrap();
        assert_eq!(on.into_iter().collect::<Vec<_>>(), vec!["garbagecollector", "nodelifecycle", "replicaset"]);
    }

    #[test]
    fn the_replication_controller_answers_to_its_short_and_long_names_and_star_includes_it() {
        for name in ["replicationcontroller", "replicationcontroller-controller"] {
            let on = enabled(&spec(&format!("-*,{name}"))).unwrap();
            assert_eq!(on.into_iter().collect::<Vec<_>>(), vec!["replicationcontroller"], "{name}");
        }
        assert!(enabled(&spec("*")).unwrap().contains("replicationcontroller"));
    }

    #[test]
    fn the_root_ca_publisher_answers_to_its_short_long_and_dashless_names() {
        for name in ["root-ca-cert-publisher", "rootcacertpublisher", "root-ca-certificate-publisher-controller"] {
            let on = enabled(&spec(&format!("-*,{name}"))).unwrap();
            assert_eq!(on.into_iter().collect::<Vec<_>>(), vec!["root-ca-cert-publisher"], "{name}");
        }
        let on = enabled(&spec("*,-serviceaccount-controller")).unwrap();
        assert!(!on.contains("serviceaccount") && on.contains("root-ca-cert-publisher"));
    }

    #[test]
    fn an_unknown_controller_is_an_error_naming_the_known_ones() {
        let err = enabled(&spec("*,-bogus")).unwrap_err();
        assert!(err.contains("\"bogus\" is not a known controller") && err.contains("replicaset"), "{err}");
    }
}
