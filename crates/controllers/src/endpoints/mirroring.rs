//! The EndpointSlice mirroring controller: the Endpoints of a Service without a selector (written
//! by hand or by another controller) mirrored into EndpointSlices (`kubernetes.io/service-name`,
//! managed by `endpointslicemirroring-controller.k8s.io`, owned by the Endpoints), so everything
//! that reads slices (the Service proxy, cluster DNS) sees them, as kube-controller-manager's
//! `endpointslicemirroring` controller does.
//!
//! Not mirrored: Endpoints labelled `endpointslice.kubernetes.io/skip-mirror: "true"` (the API
//! server's own), those of a Service with a selector (the EndpointSlice controller writes its
//! slices) or of no Service; their mirrored slices are deleted. Only IPv4 addresses are mirrored.
//! Each subset becomes slices of at most [`MAX_ENDPOINTS_PER_SLICE`] endpoints; not-ready addresses
//! are endpoints with `ready: false`. A deleted Endpoints object takes its slices along through
//! the garbage collector.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, ReconcileRequest, applier, trigger_self};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::utils::CancelableJoinHandle;
use kube::runtime::{WatchStreamExt, watcher};

use super::compute::{MANAGED_BY_LABEL, SERVICE_NAME_LABEL, SliceContent, plan_slices_with};
use super::{BACKOFF_BASE, CONCURRENCY, Error};
use crate::Context;
use crate::workloads::is_not_found;

pub const MIRRORING_MANAGED_BY: &str = "endpointslicemirroring-controller.k8s.io";
pub const SKIP_MIRROR_LABEL: &str = "endpointslice.kubernetes.io/skip-mirror";
/// kube-controller-manager's `--mirroring-max-endpoints-per-subset`.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 1000;

/// Labels of Endpoints that are not carried over (they would claim the slice for someone else).
const NOT_MIRRORED_LABELS: &[&str] = &[SKIP_MIRROR_LABEL, MANAGED_BY_LABEL, SERVICE_NAME_LABEL];

/// Whether `endpoints` of `service` are mirrored.
pub fn mirrored(endpoints: &Endpoints, service: Option<&Service>) -> bool {
    let skip = endpoints.metadata.labels.as_ref().and_then(|l| l.get(SKIP_MIRROR_LABEL)).is_some_and(|v| v == "true");
    let selectorless =
        service.is_some_and(|s| s.spec.as_ref().and_then(|s| s.selector.as_ref()).is_none_or(|s| s.is_empty()));
    !skip && selectorless && endpoints.metadata.deletion_timestamp.is_none()
}

/// The slices' contents: per subset, its IPv4 addresses (ready, then not ready) in runs of `max`.
pub fn desired(endpoints: &Endpoints, max: usize) -> Vec<SliceContent> {
    let mut out = Vec::new();
    for subset in endpoints.subsets.iter().flatten() {
        let ports: Vec<discovery::EndpointPort> = subset
            .ports
            .iter()
            .flatten()
            .map(|p| discovery::EndpointPort {
                name: p.name.clone(),
                port: Some(p.port),
                protocol: p.protocol.clone().or_else(|| Some("TCP".into())),
                app_protocol: p.app_protocol.clone(),
            })
            .collect();
        let ready = subset.addresses.iter().flatten().map(|a| (a, true));
        let not_ready = subset.not_ready_addresses.iter().flatten().map(|a| (a, false));
        let endpoints: Vec<discovery::Endpoint> = ready
            .chain(not_ready)
            .filter(|(a, _)| a.ip.parse::<Ipv4Addr>().is_ok())
            .map(|(a, ready)| discovery::Endpoint {
                addresses: vec![a.ip.clone()],
                conditions: Some(discovery::EndpointConditions {
                    ready: Some(ready),
                    serving: Some(ready),
                    terminating: None,
                }),
                hostname: a.hostname.clone(),
                node_name: a.node_name.clone(),
                target_ref: a.target_ref.clone(),
                ..Default::default()
            })
            .collect();
        for chunk in endpoints.chunks(max.max(1)) {
            out.push(SliceContent { ports: ports.clone(), endpoints: chunk.to_vec() });
        }
    }
    out
}

/// New slices' metadata: the Endpoints' labels (less the ones that name a manager), the Service's
/// name, the mirroring controller as manager, the Endpoints as owner.
pub fn slice_meta(endpoints: &Endpoints) -> ObjectMeta {
    let name = endpoints.metadata.name.clone().unwrap_or_default();
    let mut labels: BTreeMap<String, String> = endpoints
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| !NOT_MIRRORED_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert(SERVICE_NAME_LABEL.into(), name.clone());
    labels.insert(MANAGED_BY_LABEL.into(), MIRRORING_MANAGED_BY.into());
    ObjectMeta {
        generate_name: Some(format!("{name}-")),
        namespace: endpoints.metadata.namespace.clone(),
        labels: Some(labels),
        owner_references: Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Endpoints".into(),
            name,
            uid: endpoints.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]),
        ..Default::default()
    }
}

struct Shared {
    ctx: Arc<Context>,
    services: Store<Service>,
}

/// Runs the mirroring controller until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let (ep_reader, ep_writer) = reflector::store::<Endpoints>();
    let (svc_reader, svc_writer) = reflector::store::<Service>();
    let endpoints = watcher(Api::<Endpoints>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(ep_writer)
        .touched_objects();
    let endpoints_of = |ns: Option<&str>, name: &str| {
        let r = ObjectRef::<Endpoints>::new(name);
        ReconcileRequest::from(match ns {
            Some(ns) => r.within(ns),
            None => r,
        })
    };
    let services = watcher(Api::<Service>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(svc_writer)
        .touched_objects()
        .map_ok(move |s| endpoints_of(s.metadata.namespace.as_deref(), s.metadata.name.as_deref().unwrap_or("")));
    let cfg = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MIRRORING_MANAGED_BY}"));
    let slices = watcher(Api::<discovery::EndpointSlice>::all(client.clone()), cfg)
        .default_backoff()
        .touched_objects()
        .try_filter_map(move |s| {
            let name = s.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)).cloned();
            std::future::ready(Ok(name.map(|n| endpoints_of(s.metadata.namespace.as_deref(), &n))))
        });
    let queue = futures::stream::select_all([trigger_self(endpoints, ()).boxed(), services.boxed(), slices.boxed()]);
    let shared = Arc::new(Shared { ctx, services: svc_reader });
    let results = applier(
        |ep, shared| CancelableJoinHandle::spawn(reconcile(ep, shared), &tokio::runtime::Handle::current()),
        |_, _, _| Action::requeue(BACKOFF_BASE * 200),
        shared,
        ep_reader,
        queue,
        ControllerConfig::default().concurrency(CONCURRENCY),
    );
    crate::log_failures(results, "endpointslicemirroring").await
}

async fn reconcile(endpoints: Arc<Endpoints>, shared: Arc<Shared>) -> Result<Action, Error> {
    let ns = endpoints.metadata.namespace.clone().unwrap_or_default();
    let name = endpoints.metadata.name.clone().unwrap_or_default();
    let service = shared.services.get(&ObjectRef::new(&name).within(&ns));
    let want =
        if mirrored(&endpoints, service.as_deref()) { desired(&endpoints, MAX_ENDPOINTS_PER_SLICE) } else { vec![] };
    let err = |step| {
        let service = format!("{ns}/{name}");
        move |source| Error::Api { step, service, source }
    };
    let api: Api<discovery::EndpointSlice> = Api::namespaced(shared.ctx.client.clone(), &ns);
    let selector = format!("{SERVICE_NAME_LABEL}={name},{MANAGED_BY_LABEL}={MIRRORING_MANAGED_BY}");
    let existing = api.list(&ListParams::default().labels(&selector)).await.map_err(err("list mirrored slices"))?;
    if want.is_empty() && existing.items.is_empty() {
        return Ok(Action::await_change());
    }
    let plan = plan_slices_with(&slice_meta(&endpoints), want, &existing.items);
    for s in &plan.update {
        let slice_name = s.metadata.name.clone().unwrap_or_default();
        api.replace(&slice_name, &PostParams::default(), s).await.map_err(err("update a mirrored slice"))?;
    }
    for s in &plan.create {
        api.create(&PostParams::default(), s).await.map_err(err("create a mirrored slice"))?;
    }
    for slice_name in &plan.delete {
        match api.delete(slice_name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(err("delete a mirrored slice")(e)),
        }
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn endpoints(labels: serde_json::Value) -> Endpoints {
        serde_json::from_value(json!({
            "metadata": {"name": "ext", "namespace": "ns", "uid": "u1", "labels": labels},
            "subsets": [{
                "addresses": [{"ip": "10.1.0.1", "hostname": "a"}, {"ip": "fd00::1"}],
                "notReadyAddresses": [{"ip": "10.1.0.2"}],
                "ports": [{"name": "http", "port": 8080}]
            }]
        }))
        .unwrap()
    }

    fn service(selector: Option<serde_json::Value>) -> Service {
        serde_json::from_value(json!({"metadata": {"name": "ext", "namespace": "ns"}, "spec": {"selector": selector}}))
            .unwrap()
    }

    #[test]
    fn only_endpoints_of_a_selectorless_service_are_mirrored_unless_they_skip_it() {
        let ep = endpoints(json!({}));
        assert!(mirrored(&ep, Some(&service(None))));
        assert!(!mirrored(&ep, Some(&service(Some(json!({"app": "x"}))))), "the EndpointSlice controller's");
        assert!(!mirrored(&ep, None), "no Service");
        assert!(!mirrored(&endpoints(json!({SKIP_MIRROR_LABEL: "true"})), Some(&service(None))));
    }

    #[test]
    fn a_subset_becomes_a_slice_of_its_ipv4_addresses_with_readiness_and_ports() {
        let slices = desired(&endpoints(json!({})), MAX_ENDPOINTS_PER_SLICE);
        assert_eq!(slices.len(), 1);
        let s = &slices[0];
        assert_eq!(s.ports[0].port, Some(8080));
        assert_eq!(s.ports[0].protocol.as_deref(), Some("TCP"));
        let eps: Vec<(&str, Option<bool>)> = s
            .endpoints
            .iter()
            .map(|e| (e.addresses[0].as_str(), e.conditions.as_ref().and_then(|c| c.ready)))
            .collect();
        assert_eq!(eps, [("10.1.0.1", Some(true)), ("10.1.0.2", Some(false))]);
        assert_eq!(s.endpoints[0].hostname.as_deref(), Some("a"));
        assert_eq!(desired(&endpoints(json!({})), 1).len(), 2, "runs of at most max endpoints");
    }

    #[test]
    fn mirrored_slices_name_their_service_and_manager_and_are_owned_by_the_endpoints() {
        let meta = slice_meta(&endpoints(json!({"team": "a", SKIP_MIRROR_LABEL: "false"})));
        let labels = meta.labels.unwrap();
        assert_eq!(labels[SERVICE_NAME_LABEL], "ext");
        assert_eq!(labels[MANAGED_BY_LABEL], MIRRORING_MANAGED_BY);
        assert_eq!(labels["team"], "a");
        assert!(!labels.contains_key(SKIP_MIRROR_LABEL));
        let owner = &meta.owner_references.unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Endpoints", "u1"));
    }
}
