//! The nftables rules of one Service: its chains, its affinity sets and its entries in the
//! table's verdict maps. Pure. The table's fixed part lives in [`crate::table`].
//!
//! Per Service port (`id` = `namespace/name/protocol/port-name`):
//! - `service-<id>`: ClusterIP traffic. Masquerades what does not come from this node's pods,
//!   then picks an endpoint (sticky first when `sessionAffinity: ClientIP`, else at random).
//! - `external-<id>`: NodePort and external-IP traffic. `externalTrafficPolicy: Cluster`
//!   masquerades and picks among all endpoints; `Local` keeps the client's address and picks
//!   among this node's endpoints (traffic from this node itself may go anywhere).
//! - `endpoint-<id>__<ip>/<port>`: masquerades hairpin traffic (a pod reaching itself), records
//!   the client for affinity, DNATs.
//!
//! A port without endpoints gets entries in the `no-endpoint-*` maps instead, which reject new
//! connections as kube-proxy does.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use nftables::expr::{
    BinaryOperation, Expression, Fib, FibFlag, FibResult, Meta, MetaKey, NamedExpression, NgMode, Numgen, Payload,
    PayloadField, Prefix, SetItem, Verdict,
};
use nftables::stmt::{JumpTarget, Match, NAT, Operator, Statement, VerdictMap};

use crate::conntrack::{UdpFront, UdpFronts};
use crate::model::{Endpoint, Protocol, ServicePort};

/// One rule: its statements in order.
pub type Rule = Vec<Statement<'static>>;

/// The chain every masqueraded packet jumps to.
pub const MARK_FOR_MASQUERADE: &str = "mark-for-masquerade";
/// The chain that rejects new connections to a port without endpoints (not `reject`: nft would
/// read the table's listing back as the keyword).
pub const REJECT: &str = "reject-chain";

/// The table's verdict maps a Service puts entries in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MapName {
    /// `ip daddr . meta l4proto . th dport`: ClusterIPs and external IPs.
    ServiceIps,
    /// `meta l4proto . th dport` on the node's own addresses.
    ServiceNodePorts,
    NoEndpointServices,
    NoEndpointNodePorts,
}

impl MapName {
    pub const ALL: [MapName; 4] =
        [MapName::ServiceIps, MapName::ServiceNodePorts, MapName::NoEndpointServices, MapName::NoEndpointNodePorts];

    pub fn as_str(self) -> &'static str {
        match self {
            MapName::ServiceIps => "service-ips",
            MapName::ServiceNodePorts => "service-nodeports",
            MapName::NoEndpointServices => "no-endpoint-services",
            MapName::NoEndpointNodePorts => "no-endpoint-nodeports",
        }
    }

    /// Whether the map's key is an address, protocol and port (else protocol and port).
    pub fn keyed_by_address(self) -> bool {
        matches!(self, MapName::ServiceIps | MapName::NoEndpointServices)
    }
}

/// A verdict map's key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MapKey {
    Address(Ipv4Addr, Protocol, u16),
    Port(Protocol, u16),
}

impl MapKey {
    pub fn expression(&self) -> Expression<'static> {
        let items = match self {
            MapKey::Address(ip, proto, port) => {
                vec![
                    Expression::String(ip.to_string().into()),
                    proto_expr(*proto),
                    Expression::Number(u32::from(*port)),
                ]
            }
            MapKey::Port(proto, port) => vec![proto_expr(*proto), Expression::Number(u32::from(*port))],
        };
        Expression::Named(NamedExpression::Concat(items))
    }
}

/// Where this node's pods come from, to tell their traffic from everyone else's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeNetwork {
    /// The node's pod range (`spec.podCIDR`); unknown means all Service traffic is masqueraded.
    pub pod_cidr: Option<(Ipv4Addr, u8)>,
    /// Every node's pods (`--cluster-cidr`): pod traffic to anywhere else is masqueraded.
    pub cluster_cidr: Option<(Ipv4Addr, u8)>,
}

/// Everything one Service puts in the table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceRules {
    pub chains: BTreeMap<String, Vec<Rule>>,
    /// Affinity sets and their timeouts in seconds.
    pub sets: BTreeMap<String, u32>,
    /// Verdict map entries: each goes to a chain.
    pub elements: BTreeMap<(MapName, MapKey), String>,
    /// For UDP ports: where clients reach the Service and the endpoints it may send them to
    /// (whose stale conntrack entries go when that changes).
    pub udp_fronts: UdpFronts,
}

/// The rules of a Service's ports.
pub fn service_rules(ports: &[ServicePort], net: NodeNetwork) -> ServiceRules {
    let mut out = ServiceRules::default();
    for port in ports {
        add_port(&mut out, port, net);
    }
    out
}

fn add_port(out: &mut ServiceRules, port: &ServicePort, net: NodeNetwork) {
    let id = port.id();
    let service_chain = format!("service-{id}");
    let external_chain = format!("external-{id}");
    let (proto, svc_port) = (port.protocol, port.port);
    let cluster = port.cluster_endpoints();
    let external = port.external_endpoints();
    let has_external = port.node_port.is_some() || !port.external_ips.is_empty();

    for ip in &port.cluster_ips {
        let key = (MapName::ServiceIps, MapKey::Address(*ip, proto, svc_port));
        if cluster.is_empty() {
            out.elements.insert((MapName::NoEndpointServices, key.1), REJECT.into());
        } else {
            out.elements.insert(key, service_chain.clone());
        }
    }
    if !cluster.is_empty() {
        let mut rules = vec![masquerade_unless_from_pods(net)];
        rules.extend(pick(&id, port, &cluster));
        out.chains.insert(service_chain.clone(), rules);
    }

    if has_external {
        if port.endpoints.is_empty() {
            for ip in &port.external_ips {
                out.elements
                    .insert((MapName::NoEndpointServices, MapKey::Address(*ip, proto, svc_port)), REJECT.into());
            }
            if let Some(node_port) = port.node_port {
                out.elements.insert((MapName::NoEndpointNodePorts, MapKey::Port(proto, node_port)), REJECT.into());
            }
        } else {
            for ip in &port.external_ips {
                out.elements
                    .insert((MapName::ServiceIps, MapKey::Address(*ip, proto, svc_port)), external_chain.clone());
            }
            if let Some(node_port) = port.node_port {
                out.elements
                    .insert((MapName::ServiceNodePorts, MapKey::Port(proto, node_port)), external_chain.clone());
            }
            let mut rules = Vec::new();
            if port.external_local {
                // Clients on this node may go to any endpoint; others keep their address and
                // reach only this node's endpoints.
                if !cluster.is_empty() {
                    if let Some(cidr) = net.pod_cidr {
                        rules.push(vec![saddr_in(cidr, Operator::EQ), goto(&service_chain)]);
                    }
                    rules.push(vec![from_node_itself(), jump(MARK_FOR_MASQUERADE)]);
                    rules.push(vec![from_node_itself(), goto(&service_chain)]);
                }
                if external.is_empty() {
                    rules.push(vec![Statement::Drop(None)]);
                } else {
                    rules.extend(pick(&id, port, &external));
                }
            } else {
                rules.push(vec![jump(MARK_FOR_MASQUERADE)]);
                rules.extend(pick(&id, port, &external));
            }
            out.chains.insert(external_chain, rules);
        }
    }

    if proto == Protocol::Udp {
        let addresses = |eps: &[&Endpoint]| eps.iter().map(|e| e.ip).collect::<std::collections::BTreeSet<_>>();
        // With `externalTrafficPolicy: Local`, the node's own clients may go to any endpoint.
        let external_reach = if port.external_local {
            addresses(&cluster).union(&addresses(&external)).copied().collect()
        } else {
            addresses(&external)
        };
        for ip in &port.cluster_ips {
            out.udp_fronts.insert(UdpFront::Address(*ip, svc_port), addresses(&cluster));
        }
        for ip in &port.external_ips {
            out.udp_fronts.insert(UdpFront::Address(*ip, svc_port), external_reach.clone());
        }
        if let Some(node_port) = port.node_port {
            out.udp_fronts.insert(UdpFront::NodePort(node_port), external_reach.clone());
        }
    }

    let used = cluster.iter().chain(if has_external { external.iter() } else { [].iter() });
    for ep in used {
        let chain = endpoint_chain(&id, ep);
        if out.chains.contains_key(&chain) {
            continue;
        }
        let mut rules = vec![vec![saddr_is(ep.ip), jump(MARK_FOR_MASQUERADE)]];
        if let Some(timeout) = port.affinity_timeout {
            let set = affinity_set(&id, ep);
            rules.push(vec![Statement::Set(nftables::stmt::Set {
                op: nftables::stmt::SetOp::Update,
                elem: saddr(),
                set: format!("@{set}").into(),
            })]);
            out.sets.insert(set, timeout);
        }
        rules.push(vec![
            l4proto_is(proto),
            Statement::DNAT(Some(NAT {
                addr: Some(Expression::String(ep.ip.to_string().into())),
                family: None,
                port: Some(Expression::Number(u32::from(ep.port))),
                flags: None,
            })),
        ]);
        out.chains.insert(chain, rules);
    }
}

/// Affinity lookups (when sticky), then a random pick among `endpoints`.
fn pick(id: &str, port: &ServicePort, endpoints: &[&Endpoint]) -> Vec<Rule> {
    let mut rules = Vec::new();
    if port.affinity_timeout.is_some() {
        for ep in endpoints {
            rules.push(vec![
                Statement::Match(Match {
                    left: saddr(),
                    right: Expression::String(format!("@{}", affinity_set(id, ep)).into()),
                    op: Operator::EQ,
                }),
                goto(&endpoint_chain(id, ep)),
            ]);
        }
    }
    let targets = endpoints
        .iter()
        .enumerate()
        .map(|(i, ep)| {
            SetItem::Mapping(
                Expression::Number(i as u32),
                Expression::Verdict(Verdict::Goto(JumpTarget { target: endpoint_chain(id, ep).into() })),
            )
        })
        .collect();
    rules.push(vec![Statement::VerdictMap(VerdictMap {
        key: Expression::Named(NamedExpression::Numgen(Numgen {
            mode: NgMode::Random,
            ng_mod: endpoints.len() as u32,
            offset: None,
        })),
        data: Expression::Named(NamedExpression::Set(targets)),
    })]);
    rules
}

pub fn endpoint_chain(id: &str, ep: &Endpoint) -> String {
    format!("endpoint-{id}__{}/{}", ep.ip, ep.port)
}

fn affinity_set(id: &str, ep: &Endpoint) -> String {
    format!("affinity-{id}__{}/{}", ep.ip, ep.port)
}

fn masquerade_unless_from_pods(net: NodeNetwork) -> Rule {
    match net.pod_cidr {
        Some(cidr) => vec![saddr_in(cidr, Operator::NEQ), jump(MARK_FOR_MASQUERADE)],
        None => vec![jump(MARK_FOR_MASQUERADE)],
    }
}

pub fn jump(chain: &str) -> Statement<'static> {
    Statement::Jump(JumpTarget { target: chain.to_string().into() })
}

pub fn goto(chain: &str) -> Statement<'static> {
    Statement::Goto(JumpTarget { target: chain.to_string().into() })
}

pub fn payload(protocol: &'static str, field: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(Payload::PayloadField(PayloadField {
        protocol: protocol.into(),
        field: field.into(),
    })))
}

fn saddr() -> Expression<'static> {
    payload("ip", "saddr")
}

fn saddr_is(ip: Ipv4Addr) -> Statement<'static> {
    Statement::Match(Match { left: saddr(), right: Expression::String(ip.to_string().into()), op: Operator::EQ })
}

pub fn saddr_in(cidr: (Ipv4Addr, u8), op: Operator) -> Statement<'static> {
    addr_in("saddr", cidr, op)
}

pub fn daddr_in(cidr: (Ipv4Addr, u8), op: Operator) -> Statement<'static> {
    addr_in("daddr", cidr, op)
}

fn addr_in(field: &'static str, (addr, len): (Ipv4Addr, u8), op: Operator) -> Statement<'static> {
    Statement::Match(Match {
        left: payload("ip", field),
        right: Expression::Named(NamedExpression::Prefix(Prefix {
            addr: Box::new(Expression::String(addr.to_string().into())),
            len: u32::from(len),
        })),
        op,
    })
}

/// `fib saddr type local`: the packet was sent by the node itself.
fn from_node_itself() -> Statement<'static> {
    fib_type_local(FibFlag::Saddr)
}

pub fn fib_type_local(flag: FibFlag) -> Statement<'static> {
    Statement::Match(Match {
        left: Expression::Named(NamedExpression::Fib(Fib { result: FibResult::Type, flags: [flag].into() })),
        right: Expression::String("local".into()),
        op: Operator::EQ,
    })
}

pub fn meta(key: MetaKey) -> Expression<'static> {
    Expression::Named(NamedExpression::Meta(Meta { key }))
}

fn proto_expr(proto: Protocol) -> Expression<'static> {
    Expression::String(proto.as_str().into())
}

fn l4proto_is(proto: Protocol) -> Statement<'static> {
    Statement::Match(Match { left: meta(MetaKey::L4proto), right: proto_expr(proto), op: Operator::EQ })
}

/// `meta mark set meta mark <op> bit`.
pub fn set_mark(
    op: fn(Expression<'static>, Expression<'static>) -> BinaryOperation<'static>,
    bit: u32,
) -> Statement<'static> {
    Statement::Mangle(nftables::stmt::Mangle {
        key: meta(MetaKey::Mark),
        value: Expression::BinaryOperation(Box::new(op(meta(MetaKey::Mark), Expression::Number(bit)))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(endpoints: &[(&str, bool)]) -> ServicePort {
        let endpoints = endpoints
            .iter()
            .map(|(ip, local)| Endpoint { ip: ip.parse().unwrap(), port: 8080, local: *local })
            .collect();
        crate::model::example_port("http", endpoints)
    }

    fn to_json(rules: &[Rule]) -> String {
        serde_json::to_string(rules).unwrap()
    }

    const NET: NodeNetwork = NodeNetwork { pod_cidr: Some((Ipv4Addr::new(10, 244, 0, 0), 24)), cluster_cidr: None };

    #[test]
    fn a_cluster_ip_goes_to_the_service_chain_which_picks_one_endpoint_chain_at_random() {
        let rules = service_rules(&[port(&[("10.244.0.2", true), ("10.244.1.2", false)])], NET);
        let key = (MapName::ServiceIps, MapKey::Address("10.96.0.5".parse().unwrap(), Protocol::Tcp, 80));
        assert_eq!(rules.elements.get(&key).map(String::as_str), Some("service-ns/web/tcp/http"));
        assert_eq!(rules.chains.len(), 3);
        let service = to_json(&rules.chains["service-ns/web/tcp/http"]);
        assert!(service.contains(r#""left":{"payload":{"protocol":"ip","field":"saddr"}},"right":{"prefix":{"addr":"10.244.0.0","len":24}},"op":"!=""#), "{service}");
        assert!(service.contains(r#""numgen":{"mode":"random","mod":2}"#), "{service}");
        let endpoint = to_json(&rules.chains["endpoint-ns/web/tcp/http__10.244.1.2/8080"]);
        assert!(endpoint.contains(r#"{"dnat":{"addr":"10.244.1.2","port":8080}}"#), "{endpoint}");
        assert!(endpoint.contains(r#""right":"10.244.1.2""#), "hairpin traffic is masqueraded: {endpoint}");
    }

    #[test]
    fn a_port_without_endpoints_rejects_instead_of_having_chains() {
        let mut p = port(&[]);
        p.node_port = Some(30080);
        let rules = service_rules(&[p], NET);
        assert!(rules.chains.is_empty());
        let targets: Vec<_> = rules.elements.iter().map(|((map, _), chain)| (*map, chain.as_str())).collect();
        assert_eq!(targets, [(MapName::NoEndpointServices, REJECT), (MapName::NoEndpointNodePorts, REJECT)]);
    }

    #[test]
    fn client_ip_affinity_adds_a_timed_set_per_endpoint_checked_before_the_random_pick() {
        let mut p = port(&[("10.244.0.2", true)]);
        p.affinity_timeout = Some(60);
        let rules = service_rules(&[p], NET);
        assert_eq!(rules.sets.get("affinity-ns/web/tcp/http__10.244.0.2/8080"), Some(&60));
        let service = &rules.chains["service-ns/web/tcp/http"];
        assert_eq!(service.len(), 3, "masquerade, affinity lookup, pick");
        assert!(to_json(&service[1..2]).contains("@affinity-ns/web/tcp/http__10.244.0.2/8080"));
        assert!(to_json(&rules.chains["endpoint-ns/web/tcp/http__10.244.0.2/8080"]).contains(r#""op":"update""#));
    }

    #[test]
    fn external_traffic_policy_local_keeps_remote_clients_on_local_endpoints_and_drops_without_them() {
        let mut p = port(&[("10.244.1.2", false)]);
        p.node_port = Some(30080);
        p.external_local = true;
        let rules = service_rules(&[p.clone()], NET);
        let external = &rules.chains["external-ns/web/tcp/http"];
        assert_eq!(external.last().unwrap(), &vec![Statement::Drop(None)]);
        assert!(to_json(external).contains("service-ns/web/tcp/http"), "this node's clients go anywhere");

        p.endpoints.push(Endpoint { ip: "10.244.0.9".parse().unwrap(), port: 8080, local: true });
        let rules = service_rules(&[p], NET);
        let external = to_json(&rules.chains["external-ns/web/tcp/http"]);
        assert!(
            external.contains(r#""mod":1"#) && external.contains("10.244.0.9/8080") && !external.contains(r#""mod":2"#)
        );
    }

    #[test]
    fn internal_traffic_policy_local_without_local_endpoints_rejects_cluster_ip_traffic() {
        let mut p = port(&[("10.244.1.2", false)]);
        p.internal_local = true;
        let rules = service_rules(&[p], NET);
        assert!(rules.elements.keys().all(|(map, _)| *map == MapName::NoEndpointServices));
    }
}
