//! What the proxy serves, from a Service and its EndpointSlices: one [`ServicePort`] per Service
//! port, with the endpoints traffic may go to. Pure; follows kube-proxy's choices:
//!
//! - Only IPv4 addresses are served (IPv4 ClusterIPs, IPv4 slices).
//! - Headless and ExternalName Services get nothing.
//! - An endpoint takes traffic when ready; when none of a port's endpoints is ready, the serving
//!   ones that are terminating do (so a rollout's last old pod drains instead of refusing).
//! - An endpoint is local when its `nodeName` is this node.

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The label naming an EndpointSlice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Kubernetes' default `sessionAffinityConfig.clientIP.timeoutSeconds`.
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;

/// A transport protocol as nftables names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// A Service's `protocol` (TCP when unset).
    pub fn parse(protocol: Option<&str>) -> Option<Protocol> {
        match protocol.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// The IP protocol number (`meta l4proto`).
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }
}

/// A Service, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    pub namespace: String,
    pub name: String,
}

impl ServiceKey {
    pub fn new(namespace: &str, name: &str) -> ServiceKey {
        ServiceKey { namespace: namespace.to_string(), name: name.to_string() }
    }

    pub fn of(svc: &Service) -> ServiceKey {
        ServiceKey::new(
            svc.metadata.namespace.as_deref().unwrap_or_default(),
            svc.metadata.name.as_deref().unwrap_or_default(),
        )
    }

    /// The Service an EndpointSlice belongs to, from its label.
    pub fn of_slice(slice: &EndpointSlice) -> Option<ServiceKey> {
        let name = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
        Some(ServiceKey::new(slice.metadata.namespace.as_deref().unwrap_or_default(), name))
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One endpoint of a Service port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    pub ip: Ipv4Addr,
    pub port: u16,
    /// On this node.
    pub local: bool,
}

/// One port of a Service, as the proxy serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub service: ServiceKey,
    /// The port's name (empty for a Service's only, unnamed port).
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
    pub cluster_ips: Vec<Ipv4Addr>,
    pub external_ips: Vec<Ipv4Addr>,
    pub node_port: Option<u16>,
    /// `sessionAffinity: ClientIP`: its timeout in seconds.
    pub affinity_timeout: Option<u32>,
    /// `externalTrafficPolicy: Local` (only for NodePorts and external IPs).
    pub external_local: bool,
    /// `internalTrafficPolicy: Local` (for ClusterIPs).
    pub internal_local: bool,
    /// The endpoints traffic may go to, sorted and without duplicates.
    pub endpoints: Vec<Endpoint>,
}

impl ServicePort {
    /// `namespace/name/protocol/port-name`: unique per Service port, the base of its chains' names.
    pub fn id(&self) -> String {
        format!("{}/{}/{}/{}", self.service.namespace, self.service.name, self.protocol.as_str(), self.name)
    }

    /// Where ClusterIP traffic goes.
    pub fn cluster_endpoints(&self) -> Vec<&Endpoint> {
        self.endpoints.iter().filter(|e| !self.internal_local || e.local).collect()
    }

    /// Where NodePort and external-IP traffic from outside the node goes.
    pub fn external_endpoints(&self) -> Vec<&Endpoint> {
        self.endpoints.iter().filter(|e| !self.external_local || e.local).collect()
    }
}

/// The Service's ports with their endpoints, or none when the proxy has nothing to do for it.
pub fn service_ports<'a>(
    svc: &Service,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    node_name: &str,
) -> Vec<ServicePort> {
    let Some(spec) = &svc.spec else { return Vec::new() };
    if spec.type_.as_deref() == Some("ExternalName") {
        return Vec::new();
    }
    let cluster_ips: Vec<Ipv4Addr> =
        spec.cluster_ips.iter().flatten().chain(spec.cluster_ip.iter()).filter_map(|ip| ip.parse().ok()).fold(
            Vec::new(),
            |mut ips, ip| {
                if !ips.contains(&ip) {
                    ips.push(ip);
                }
                ips
            },
        );
    if cluster_ips.is_empty() {
        // Headless, or no IPv4 address: DNS's business, not the proxy's.
        return Vec::new();
    }
    let external_ips: Vec<Ipv4Addr> = spec.external_ips.iter().flatten().filter_map(|ip| ip.parse().ok()).collect();
    let affinity_timeout = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT)
    });
    let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");
    let has_node_ports = type_ == "NodePort" || type_ == "LoadBalancer";
    let slices: Vec<&EndpointSlice> = slices.into_iter().filter(|s| s.address_type == "IPv4").collect();
    let key = ServiceKey::of(svc);
    spec.ports
        .iter()
        .flatten()
        .filter_map(|port| {
            let protocol = Protocol::parse(port.protocol.as_deref())?;
            let name = port.name.clone().unwrap_or_default();
            Some(ServicePort {
                service: key.clone(),
                endpoints: endpoints(&slices, &name, protocol, node_name),
                name,
                protocol,
                port: u16::try_from(port.port).ok()?,
                cluster_ips: cluster_ips.clone(),
                external_ips: external_ips.clone(),
                node_port: port.node_port.filter(|_| has_node_ports).and_then(|p| u16::try_from(p).ok()),
                affinity_timeout,
                external_local: spec.external_traffic_policy.as_deref() == Some("Local"),
                internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
            })
        })
        .collect()
}

/// The endpoints of the slices' port named `port_name`: the ready ones, or, when none is ready,
/// the serving ones that are terminating.
fn endpoints(slices: &[&EndpointSlice], port_name: &str, protocol: Protocol, node_name: &str) -> Vec<Endpoint> {
    // (endpoint, ready, serving-and-terminating)
    let mut found: BTreeMap<Endpoint, (bool, bool)> = BTreeMap::new();
    for slice in slices {
        let Some(port) = slice.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or_default() == port_name
                && Protocol::parse(p.protocol.as_deref()) == Some(protocol)
        }) else {
            continue;
        };
        let Some(port) = port.port.and_then(|p| u16::try_from(p).ok()) else { continue };
        for ep in &slice.endpoints {
            let conditions = ep.conditions.as_ref();
            let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
            let serving = conditions.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
            let local = ep.node_name.as_deref() == Some(node_name);
            for ip in ep.addresses.iter().filter_map(|a| a.parse::<Ipv4Addr>().ok()) {
                let e = found.entry(Endpoint { ip, port, local }).or_default();
                e.0 |= ready;
                e.1 |= serving && terminating;
            }
        }
    }
    let any_ready = found.values().any(|(ready, _)| *ready);
    found
        .into_iter()
        .filter(|(_, (ready, fallback))| if any_ready { *ready } else { *fallback })
        .map(|(e, _)| e)
        .collect()
}

/// `ns/web` port `name`: TCP 80 on ClusterIP 10.96.0.5 with `endpoints`, the port the unit tests
/// of the rules, the diff and the netlink encoding start from.
#[cfg(test)]
pub(crate) fn example_port(name: &str, endpoints: Vec<Endpoint>) -> ServicePort {
    ServicePort {
        service: ServiceKey::new("ns", "web"),
        name: name.into(),
        protocol: Protocol::Tcp,
        port: 80,
        cluster_ips: vec![Ipv4Addr::new(10, 96, 0, 5)],
        external_ips: vec![],
        node_port: None,
        affinity_timeout: None,
        external_local: false,
        internal_local: false,
        endpoints,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(spec: serde_json::Value) -> Service {
        serde_json::from_value(json!({"metadata": {"namespace": "ns", "name": "web"}, "spec": spec})).unwrap()
    }

    fn slice(endpoints: serde_json::Value, ports: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "web-abc", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4", "endpoints": endpoints, "ports": ports,
        }))
        .unwrap()
    }

    fn ips(port: &ServicePort) -> Vec<String> {
        port.endpoints.iter().map(|e| format!("{}:{}", e.ip, e.port)).collect()
    }

    #[test]
    fn a_cluster_ip_service_serves_each_port_with_its_ready_endpoints_by_port_name() {
        let svc = service(json!({"clusterIP": "10.96.0.5", "ports": [
            {"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}]}));
        let s = slice(
            json!([
                {"addresses": ["10.244.0.2"], "conditions": {"ready": true}, "nodeName": "a"},
                {"addresses": ["10.244.1.3"], "conditions": {"ready": false}, "nodeName": "b"},
                {"addresses": ["10.244.1.4"], "nodeName": "b"},
            ]),
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "dns", "port": 5353, "protocol": "UDP"}]),
        );
        let ports = service_ports(&svc, [&s], "a");
        assert_eq!(ports.len(), 2);
        assert_eq!(ports[0].id(), "ns/web/tcp/http");
        assert_eq!(ips(&ports[0]), ["10.244.0.2:8080", "10.244.1.4:8080"]);
        assert!(ports[0].endpoints[0].local && !ports[0].endpoints[1].local);
        assert_eq!((ports[1].protocol, ports[1].port), (Protocol::Udp, 53));
        assert_eq!(ips(&ports[1]), ["10.244.0.2:5353", "10.244.1.4:5353"]);
    }

    #[test]
    fn terminating_serving_endpoints_take_traffic_only_when_none_is_ready() {
        let svc = service(json!({"clusterIP": "10.96.0.5", "ports": [{"port": 80}]}));
        let draining =
            json!({"addresses": ["10.244.0.9"], "conditions": {"ready": false, "serving": true, "terminating": true}});
        let only_draining = slice(json!([draining]), json!([{"port": 80}]));
        assert_eq!(ips(&service_ports(&svc, [&only_draining], "a")[0]), ["10.244.0.9:80"]);
        let with_ready = slice(json!([draining, {"addresses": ["10.244.0.2"]}]), json!([{"port": 80}]));
        assert_eq!(ips(&service_ports(&svc, [&with_ready], "a")[0]), ["10.244.0.2:80"]);
    }

    #[test]
    fn headless_and_external_name_services_are_not_proxied() {
        let headless = service(json!({"clusterIP": "None", "ports": [{"port": 80}]}));
        assert!(service_ports(&headless, [], "a").is_empty());
        let external = service(json!({"type": "ExternalName", "externalName": "example.com"}));
        assert!(service_ports(&external, [], "a").is_empty());
    }

    #[test]
    fn node_ports_affinity_and_traffic_policies_are_read_from_the_spec() {
        let svc = service(json!({"type": "NodePort", "clusterIP": "10.96.0.5", "externalIPs": ["192.0.2.1"],
            "sessionAffinity": "ClientIP", "externalTrafficPolicy": "Local", "internalTrafficPolicy": "Local",
            "ports": [{"port": 80, "nodePort": 30080}]}));
        let s = slice(
            json!([{"addresses": ["10.244.0.2"], "nodeName": "a"}, {"addresses": ["10.244.1.2"], "nodeName": "b"}]),
            json!([{"port": 80}]),
        );
        let port = &service_ports(&svc, [&s], "a")[0];
        assert_eq!(port.node_port, Some(30080));
        assert_eq!(port.external_ips, ["192.0.2.1".parse::<Ipv4Addr>().unwrap()]);
        assert_eq!(port.affinity_timeout, Some(DEFAULT_AFFINITY_TIMEOUT));
        assert_eq!(port.cluster_endpoints().len(), 1, "internal Local keeps only this node's endpoint");
        assert_eq!(port.external_endpoints().len(), 1);
        let clusterip = service(json!({"clusterIP": "10.96.0.5", "ports": [{"port": 80, "nodePort": 30080}]}));
        assert_eq!(service_ports(&clusterip, [&s], "a")[0].node_port, None, "a ClusterIP Service has no node port");
    }

    #[test]
    fn an_endpoint_listed_by_two_slices_is_served_once() {
        let svc = service(json!({"clusterIP": "10.96.0.5", "ports": [{"port": 80}]}));
        let a = slice(json!([{"addresses": ["10.244.0.2"]}]), json!([{"port": 80}]));
        let b = slice(json!([{"addresses": ["10.244.0.2"]}]), json!([{"port": 80}]));
        assert_eq!(ips(&service_ports(&svc, [&a, &b], "a")[0]), ["10.244.0.2:80"]);
    }
}
