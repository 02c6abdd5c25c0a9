//! What a Service's Endpoints and EndpointSlices should hold, from the Service and its pods.
//! Pure functions, as kube-controller-manager's endpoint and endpointslice controllers decide:
//!
//! - A pod counts if it has an IP and has not finished (`Succeeded`/`Failed`).
//! - EndpointSlices list terminating pods too: `ready` is the pod's Ready condition and not
//!   terminating (or `publishNotReadyAddresses`), `serving` the Ready condition, `terminating`
//!   the deletion timestamp. Endpoints leave terminating pods out (unless
//!   `publishNotReadyAddresses`) and put unready ones in `notReadyAddresses`.
//! - Each Service port is resolved per pod: a number is taken as is, a name is looked up among
//!   the pod's container ports of the same protocol; a pod lacking the name is left out of that
//!   port. Pods are grouped by the ports they resolve to: one Endpoints subset, or one run of
//!   slices of at most [`MAX_ENDPOINTS_PER_SLICE`], per group.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort, EndpointSubset, ObjectReference, Pod, Service};
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// kube-controller-manager's `--max-endpoints-per-slice` default.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";

/// One resolved port: (name, port, protocol, appProtocol).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Port {
    pub name: String,
    pub port: i32,
    pub protocol: String,
    pub app_protocol: Option<String>,
}

/// A pod as an endpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct PodEndpoint {
    pub ip: String,
    pub node_name: Option<String>,
    pub hostname: Option<String>,
    pub target: ObjectReference,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The pod as an endpoint of `svc`, if it can be one.
pub fn pod_endpoint(svc: &Service, pod: &Pod) -> Option<PodEndpoint> {
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let ip = status
        .pod_ips
        .as_ref()
        .and_then(|ips| ips.first())
        .map(|p| p.ip.clone())
        .or_else(|| status.pod_ip.clone())
        .filter(|ip| !ip.is_empty())?;
    let publish = svc.spec.as_ref().and_then(|s| s.publish_not_ready_addresses).unwrap_or(false);
    let terminating = pod.metadata.deletion_timestamp.is_some();
    let serving = pod_ready(pod);
    let spec = pod.spec.as_ref();
    let service_name = svc.metadata.name.as_deref();
    let hostname = spec
        .filter(|s| s.subdomain.as_deref().is_some() && s.subdomain.as_deref() == service_name)
        .and_then(|s| s.hostname.clone());
    Some(PodEndpoint {
        ip,
        node_name: spec.and_then(|s| s.node_name.clone()),
        hostname,
        target: ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        },
        ready: publish || (serving && !terminating),
        serving: publish || serving,
        terminating,
    })
}

/// The Service's ports as this pod serves them (`podutil.FindPort`).
pub fn resolve_ports(svc: &Service, pod: &Pod) -> Vec<Port> {
    let mut out = Vec::new();
    for sp in svc.spec.as_ref().and_then(|s| s.ports.as_deref()).unwrap_or_default() {
        let protocol = sp.protocol.clone().unwrap_or_else(|| "TCP".into());
        let port = match &sp.target_port {
            None => Some(sp.port),
            Some(IntOrString::Int(n)) => Some(*n),
            Some(IntOrString::String(name)) => pod
                .spec
                .iter()
                .flat_map(|s| s.containers.iter())
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| p.name.as_deref() == Some(name) && p.protocol.as_deref().unwrap_or("TCP") == protocol)
                .map(|p| p.container_port),
        };
        if let Some(port) = port {
            out.push(Port {
                name: sp.name.clone().unwrap_or_default(),
                port,
                protocol,
                app_protocol: sp.app_protocol.clone(),
            });
        }
    }
    out
}

/// The pods grouped by the ports they resolve to, each group sorted by IP.
pub fn groups(svc: &Service, pods: &[Pod]) -> BTreeMap<Vec<Port>, Vec<PodEndpoint>> {
    let mut out: BTreeMap<Vec<Port>, Vec<PodEndpoint>> = BTreeMap::new();
    for pod in pods {
        if let Some(ep) = pod_endpoint(svc, pod) {
            let mut ports = resolve_ports(svc, pod);
            ports.sort();
            out.entry(ports).or_default().push(ep);
        }
    }
    for eps in out.values_mut() {
        eps.sort_by(|a, b| a.ip.cmp(&b.ip).then_with(|| a.target.name.cmp(&b.target.name)));
    }
    out
}

/// The subsets of the Service's Endpoints object.
pub fn endpoint_subsets(svc: &Service, pods: &[Pod]) -> Vec<EndpointSubset> {
    let publish = svc.spec.as_ref().and_then(|s| s.publish_not_ready_addresses).unwrap_or(false);
    let mut subsets = Vec::new();
    for (ports, eps) in groups(svc, pods) {
        let mut ready = Vec::new();
        let mut not_ready = Vec::new();
        for ep in eps {
            if ep.terminating && !publish {
                continue;
            }
            let addr = EndpointAddress {
                ip: ep.ip.clone(),
                hostname: ep.hostname.clone(),
                node_name: ep.node_name.clone(),
                target_ref: Some(ep.target.clone()),
            };
            if ep.ready { ready.push(addr) } else { not_ready.push(addr) }
        }
        if ready.is_empty() && not_ready.is_empty() {
            continue;
        }
        let ports: Vec<EndpointPort> = ports
            .into_iter()
            .map(|p| EndpointPort {
                name: Some(p.name).filter(|n| !n.is_empty()),
                port: p.port,
                protocol: Some(p.protocol),
                app_protocol: p.app_protocol,
            })
            .collect();
        subsets.push(EndpointSubset {
            addresses: Some(ready).filter(|a| !a.is_empty()),
            not_ready_addresses: Some(not_ready).filter(|a| !a.is_empty()),
            ports: Some(ports).filter(|p| !p.is_empty()),
        });
    }
    subsets
}

/// At most this many addresses are kept in an Endpoints object (`maxCapacity`).
pub const MAX_ENDPOINTS_ADDRESSES: usize = 1000;
pub const OVER_CAPACITY_ANNOTATION: &str = "endpoints.kubernetes.io/over-capacity";

/// Keeps at most [`MAX_ENDPOINTS_ADDRESSES`] addresses, ready ones first, taking from each
/// subset in proportion to its size, as the Endpoints controller truncates; `true` if it had to.
pub fn truncate_subsets(subsets: &mut [EndpointSubset]) -> bool {
    let count = |s: &EndpointSubset| {
        s.addresses.as_ref().map_or(0, Vec::len) + s.not_ready_addresses.as_ref().map_or(0, Vec::len)
    };
    let total: usize = subsets.iter().map(count).sum();
    if total <= MAX_ENDPOINTS_ADDRESSES {
        return false;
    }
    let mut left = MAX_ENDPOINTS_ADDRESSES;
    let n = subsets.len();
    for (i, s) in subsets.iter_mut().enumerate() {
        let mut keep = if i + 1 == n { left } else { count(s) * MAX_ENDPOINTS_ADDRESSES / total };
        keep = keep.min(left);
        left -= keep;
        let ready = s.addresses.get_or_insert_with(Vec::new);
        ready.truncate(keep);
        let rest = keep - ready.len();
        s.not_ready_addresses.get_or_insert_with(Vec::new).truncate(rest);
        if s.addresses.as_ref().is_some_and(Vec::is_empty) {
            s.addresses = None;
        }
        if s.not_ready_addresses.as_ref().is_some_and(Vec::is_empty) {
            s.not_ready_addresses = None;
        }
    }
    true
}

/// The labels of the Service's Endpoints: the Service's, plus `service.kubernetes.io/headless`
/// for a headless Service.
pub fn endpoints_labels(svc: &Service) -> BTreeMap<String, String> {
    let mut labels = svc.metadata.labels.clone().unwrap_or_default();
    if svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None") {
        labels.insert(HEADLESS_LABEL.into(), String::new());
    }
    labels
}

/// The content of one slice: its ports and endpoints.
#[derive(Clone, Debug, PartialEq)]
pub struct SliceContent {
    pub ports: Vec<discovery::EndpointPort>,
    pub endpoints: Vec<discovery::Endpoint>,
}

/// The slices the Service should have: per port group, runs of at most `max` endpoints; one
/// empty slice with no ports when no pod qualifies (kube's placeholder).
pub fn desired_slices(svc: &Service, pods: &[Pod], max: usize) -> Vec<SliceContent> {
    let mut out = Vec::new();
    for (ports, eps) in groups(svc, pods) {
        let ports: Vec<discovery::EndpointPort> = ports
            .into_iter()
            .map(|p| discovery::EndpointPort {
                name: Some(p.name),
                port: Some(p.port),
                protocol: Some(p.protocol),
                app_protocol: p.app_protocol,
            })
            .collect();
        let endpoints: Vec<discovery::Endpoint> = eps
            .into_iter()
            .map(|ep| discovery::Endpoint {
                addresses: vec![ep.ip],
                conditions: Some(discovery::EndpointConditions {
                    ready: Some(ep.ready),
                    serving: Some(ep.serving),
                    terminating: Some(ep.terminating),
                }),
                hostname: ep.hostname,
                node_name: ep.node_name,
                target_ref: Some(ep.target),
                ..Default::default()
            })
            .collect();
        for chunk in endpoints.chunks(max.max(1)) {
            out.push(SliceContent { ports: ports.clone(), endpoints: chunk.to_vec() });
        }
    }
    if out.is_empty() {
        out.push(SliceContent { ports: Vec::new(), endpoints: Vec::new() });
    }
    out
}

/// The labels and owner of every slice of `svc`.
pub fn slice_meta(svc: &Service) -> ObjectMeta {
    let name = svc.metadata.name.clone().unwrap_or_default();
    let mut labels = endpoints_labels(svc);
    labels.insert(SERVICE_NAME_LABEL.into(), name.clone());
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    ObjectMeta {
        generate_name: Some(format!("{name}-")),
        namespace: svc.metadata.namespace.clone(),
        labels: Some(labels),
        owner_references: Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Service".into(),
            name,
            uid: svc.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]),
        ..Default::default()
    }
}

/// What to write to turn the existing slices into the desired ones.
#[derive(Debug, Default, PartialEq)]
pub struct SlicePlan {
    pub create: Vec<discovery::EndpointSlice>,
    /// Existing slices with new content (name and resourceVersion kept).
    pub update: Vec<discovery::EndpointSlice>,
    /// Names of slices to delete.
    pub delete: Vec<String>,
}

fn content_of(s: &discovery::EndpointSlice) -> SliceContent {
    SliceContent { ports: s.ports.clone().unwrap_or_default(), endpoints: s.endpoints.clone() }
}

/// Reuses existing slices with the same ports (in name order) for the desired contents, updating
/// those whose endpoints or labels differ, creates what is missing and deletes the rest.
pub fn plan_slices(svc: &Service, desired: Vec<SliceContent>, existing: &[discovery::EndpointSlice]) -> SlicePlan {
    plan_slices_with(&slice_meta(svc), desired, existing)
}

/// [`plan_slices`] for slices whose new ones get `meta` (their labels also go on reused ones).
pub fn plan_slices_with(
    meta: &ObjectMeta,
    desired: Vec<SliceContent>,
    existing: &[discovery::EndpointSlice],
) -> SlicePlan {
    let mut plan = SlicePlan::default();
    let mut existing: Vec<&discovery::EndpointSlice> = existing.iter().collect();
    existing.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut used = vec![false; existing.len()];
    let mut unmatched = Vec::new();
    // Slices whose content is already right stay as they are.
    for want in desired {
        let same = (0..existing.len()).find(|i| !used[*i] && content_of(existing[*i]) == want);
        match same {
            Some(i) => {
                used[i] = true;
                if existing[i].metadata.labels != meta.labels || existing[i].address_type != "IPv4" {
                    let mut s = existing[i].clone();
                    s.metadata.labels = meta.labels.clone();
                    plan.update.push(s);
                }
            }
            None => unmatched.push(want),
        }
    }
    for want in unmatched {
        let reuse = (0..existing.len()).find(|i| !used[*i]);
        match reuse {
            Some(i) => {
                used[i] = true;
                let mut s = existing[i].clone();
                s.metadata.labels = meta.labels.clone();
                s.ports = Some(want.ports);
                s.endpoints = want.endpoints;
                plan.update.push(s);
            }
            None => plan.create.push(discovery::EndpointSlice {
                metadata: meta.clone(),
                address_type: "IPv4".into(),
                endpoints: want.endpoints,
                ports: Some(want.ports),
            }),
        }
    }
    for (i, s) in existing.iter().enumerate() {
        if !used[i] {
            plan.delete.push(s.metadata.name.clone().unwrap_or_default());
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(target_port: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "svc-uid", "labels": {"app": "web"}},
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": target_port}]}
        }))
        .unwrap()
    }

    fn pod(name: &str, ip: &str, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i",
                "ports": [{"name": "web", "containerPort": 8080, "protocol": "TCP"}]}]},
            "status": {"phase": "Running", "podIP": ip,
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap()
    }

    #[test]
    fn ready_pods_are_addresses_and_unready_ones_not_ready_addresses() {
        let svc = service(json!(8080));
        let subsets = endpoint_subsets(&svc, &[pod("b", "10.0.0.2", false), pod("a", "10.0.0.1", true)]);
        assert_eq!(subsets.len(), 1);
        let s = &subsets[0];
        assert_eq!(s.addresses.as_ref().unwrap()[0].ip, "10.0.0.1");
        assert_eq!(s.addresses.as_ref().unwrap()[0].node_name.as_deref(), Some("n1"));
        assert_eq!(s.addresses.as_ref().unwrap()[0].target_ref.as_ref().unwrap().name.as_deref(), Some("a"));
        assert_eq!(s.not_ready_addresses.as_ref().unwrap()[0].ip, "10.0.0.2");
        assert_eq!(s.ports.as_ref().unwrap()[0].port, 8080);
        assert_eq!(s.ports.as_ref().unwrap()[0].name.as_deref(), Some("http"));
    }

    #[test]
    fn a_named_target_port_is_resolved_per_pod_and_pods_without_it_are_left_out_of_the_port() {
        let svc = service(json!("web"));
        let mut other = pod("b", "10.0.0.2", true);
        other.spec.as_mut().unwrap().containers[0].ports = None;
        let groups = groups(&svc, &[pod("a", "10.0.0.1", true), other]);
        let with_port: Vec<_> =
            groups.iter().find(|(p, _)| !p.is_empty()).unwrap().1.iter().map(|e| e.ip.clone()).collect();
        assert_eq!(with_port, ["10.0.0.1"]);
        assert_eq!(groups.keys().find(|p| !p.is_empty()).unwrap()[0].port, 8080);
        assert!(groups.contains_key(&Vec::new()), "the pod without the port is grouped alone");
    }

    #[test]
    fn terminating_pods_are_in_slices_as_serving_but_not_in_endpoints() {
        let svc = service(json!(8080));
        let mut going = pod("a", "10.0.0.1", true);
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH));
        assert!(endpoint_subsets(&svc, std::slice::from_ref(&going)).is_empty());
        let slices = desired_slices(&svc, &[going], MAX_ENDPOINTS_PER_SLICE);
        let c = slices[0].endpoints[0].conditions.clone().unwrap();
        assert_eq!((c.ready, c.serving, c.terminating), (Some(false), Some(true), Some(true)));
    }

    #[test]
    fn pods_without_an_ip_or_finished_are_not_endpoints() {
        let svc = service(json!(8080));
        let mut no_ip = pod("a", "", true);
        no_ip.status.as_mut().unwrap().pod_ip = None;
        let mut done = pod("b", "10.0.0.2", false);
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert!(endpoint_subsets(&svc, &[no_ip.clone(), done.clone()]).is_empty());
        let slices = desired_slices(&svc, &[no_ip, done], MAX_ENDPOINTS_PER_SLICE);
        assert_eq!(slices, [SliceContent { ports: vec![], endpoints: vec![] }], "one empty placeholder slice");
    }

    #[test]
    fn slices_hold_at_most_the_maximum_and_reuse_existing_ones() {
        let svc = service(json!(8080));
        let pods: Vec<Pod> = (0..5).map(|i| pod(&format!("p{i}"), &format!("10.0.0.{i}"), true)).collect();
        let desired = desired_slices(&svc, &pods, 2);
        assert_eq!(desired.iter().map(|s| s.endpoints.len()).collect::<Vec<_>>(), [2, 2, 1]);
        let plan = plan_slices(&svc, desired.clone(), &[]);
        assert_eq!((plan.create.len(), plan.update.len(), plan.delete.len()), (3, 0, 0));
        let created = &plan.create[0];
        let labels = created.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[SERVICE_NAME_LABEL], "web");
        assert_eq!(labels[MANAGED_BY_LABEL], MANAGED_BY);
        assert_eq!(created.metadata.owner_references.as_ref().unwrap()[0].uid, "svc-uid");
        assert_eq!(created.address_type, "IPv4");
        // Written back with names, the same desired state needs nothing; fewer pods update one
        // slice and delete another.
        let existing: Vec<_> = plan
            .create
            .into_iter()
            .enumerate()
            .map(|(i, mut s)| {
                s.metadata.name = Some(format!("web-{i}"));
                s
            })
            .collect();
        assert_eq!(plan_slices(&svc, desired, &existing), SlicePlan::default());
        let fewer = desired_slices(&svc, &pods[..3], 2);
        let plan = plan_slices(&svc, fewer, &existing);
        assert_eq!((plan.create.len(), plan.update.len(), plan.delete.len()), (0, 1, 1));
    }

    #[test]
    fn endpoints_are_truncated_to_a_thousand_addresses() {
        let svc = service(json!(8080));
        let pods: Vec<Pod> =
            (0..1200).map(|i| pod(&format!("p{i}"), &format!("10.{}.{}.1", i / 256, i % 256), i % 2 == 0)).collect();
        let mut subsets = endpoint_subsets(&svc, &pods);
        assert!(truncate_subsets(&mut subsets));
        let s = &subsets[0];
        assert_eq!(s.addresses.as_ref().unwrap().len(), 600, "ready addresses are kept first");
        assert_eq!(s.not_ready_addresses.as_ref().unwrap().len(), 400);
        let mut small = endpoint_subsets(&svc, &pods[..3]);
        assert!(!truncate_subsets(&mut small));
    }
}
