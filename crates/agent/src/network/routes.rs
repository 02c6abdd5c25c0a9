//! Routes to other nodes' pods (host-gw): `podCIDR via InternalIP` for every other node whose
//! InternalIP is on a network this machine is directly connected to, in the main table, tagged
//! with [`ROUTE_PROTOCOL`] so they are told apart from everyone else's and can all be removed
//! ([`remove_all_routes`]).
//!
//! The decisions are pure ([`desired_routes`], [`plan`]); the kernel is behind [`RouteTable`],
//! whose one real implementation, [`Netlink`], speaks rtnetlink.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Node;
use rtnetlink::RouteMessageBuilder;
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteType,
};

/// The routing protocol number berth's routes carry (`ip route show proto 148`); unassigned in
/// iproute2's `rt_protos`.
pub const ROUTE_PROTOCOL: u8 = 148;

#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("opening a netlink socket")]
    Connect(#[source] std::io::Error),
    #[error("{what}")]
    Netlink {
        what: String,
        #[source]
        source: rtnetlink::Error,
    },
}

/// An IPv4 network; the address has no host bits set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ipv4Net {
    pub network: Ipv4Addr,
    pub prefix: u8,
}

impl Ipv4Net {
    /// `10.244.1.0/24` (host bits are cleared); `None` for anything else, IPv6 included.
    pub fn parse(text: &str) -> Option<Ipv4Net> {
        let (addr, prefix) = text.trim().split_once('/')?;
        let addr: Ipv4Addr = addr.parse().ok()?;
        let prefix: u8 = prefix.parse().ok().filter(|p| *p <= 32)?;
        Some(Ipv4Net { network: Ipv4Addr::from(u32::from(addr) & mask(prefix)), prefix })
    }
}

fn mask(prefix: u8) -> u32 {
    if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) }
}

impl fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// An IPv4 address of this machine with its prefix: the network it is directly connected to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalAddress {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

/// An IPv4 route of the main table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelRoute {
    pub dst: Ipv4Net,
    pub gateway: Option<Ipv4Addr>,
    /// Whether it carries [`ROUTE_PROTOCOL`].
    pub berth: bool,
}

/// Why a node with a pod CIDR and an InternalIP gets no route.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Unroutable {
    /// Its InternalIP is on no network this machine is directly connected to (another subnet,
    /// behind a router): host-gw cannot reach it.
    NotConnected { node: String, ip: Ipv4Addr },
    /// Its InternalIP is this machine's own address.
    OwnAddress { node: String, ip: Ipv4Addr },
}

impl fmt::Display for Unroutable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unroutable::NotConnected { node, ip } => write!(
                f,
                "node {node}'s InternalIP {ip} is on no directly connected network: its pods are not routed (host-gw \
                 needs the nodes on one L2 network)"
            ),
            Unroutable::OwnAddress { node, ip } => {
                write!(f, "node {node}'s InternalIP {ip} is this machine's own address: its pods are not routed")
            }
        }
    }
}

/// The routes wanted, by destination, and the nodes that cannot have one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    pub routes: BTreeMap<Ipv4Net, Ipv4Addr>,
    pub unroutable: Vec<Unroutable>,
}

/// The first IPv4 InternalIP of a node.
fn internal_ip(node: &Node) -> Option<Ipv4Addr> {
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    addresses.iter().filter(|a| a.type_ == "InternalIP").find_map(|a| a.address.parse().ok())
}

/// The IPv4 pod CIDRs of a node (`spec.podCIDRs`, or `spec.podCIDR`).
fn pod_cidrs(node: &Node) -> Vec<Ipv4Net> {
    let Some(spec) = node.spec.as_ref() else { return Vec::new() };
    let listed = spec.pod_cidrs.clone().unwrap_or_default();
    let all = if listed.is_empty() { spec.pod_cidr.clone().into_iter().collect() } else { listed };
    all.iter().filter_map(|c| Ipv4Net::parse(c)).collect()
}

/// The route to each other node's pod CIDRs via its InternalIP, for the nodes whose InternalIP
/// is on a network one of `local` addresses is on. Nodes without a pod CIDR or an InternalIP
/// are left out silently: they have not got that far yet.
pub fn desired_routes<'a>(nodes: impl IntoIterator<Item = &'a Node>, own: &str, local: &[LocalAddress]) -> Desired {
    let mut desired = Desired::default();
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        if name == own {
            continue;
        }
        let cidrs = pod_cidrs(node);
        let Some(ip) = internal_ip(node).filter(|_| !cidrs.is_empty()) else { continue };
        if local.iter().any(|l| l.addr == ip) {
            desired.unroutable.push(Unroutable::OwnAddress { node: name, ip });
            continue;
        }
        let connected = local.iter().any(|l| same_network(l.addr, ip, l.prefix));
        if !connected {
            desired.unroutable.push(Unroutable::NotConnected { node: name, ip });
            continue;
        }
        for cidr in cidrs {
            desired.routes.entry(cidr).or_insert(ip);
        }
    }
    desired
}

/// Whether `a` and `b` are on the same `/prefix` network.
fn same_network(a: Ipv4Addr, b: Ipv4Addr, prefix: u8) -> bool {
    u32::from(a) & mask(prefix) == u32::from(b) & mask(prefix)
}

/// One change to the main table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Replace { dst: Ipv4Net, gateway: Ipv4Addr },
    Delete { dst: Ipv4Net, gateway: Option<Ipv4Addr> },
}

/// The changes that make berth's routes in `actual` the `desired` ones, and the destinations
/// left alone because a route berth did not make already covers them exactly (someone else's
/// routing wins).
pub fn plan(desired: &BTreeMap<Ipv4Net, Ipv4Addr>, actual: &[KernelRoute]) -> (Vec<Change>, Vec<Ipv4Net>) {
    let mut changes = Vec::new();
    let mut foreign = Vec::new();
    for (dst, gateway) in desired {
        let present: Vec<&KernelRoute> = actual.iter().filter(|r| r.dst == *dst).collect();
        if present.iter().any(|r| !r.berth) {
            foreign.push(*dst);
        } else if !present.iter().any(|r| r.gateway == Some(*gateway)) {
            changes.push(Change::Replace { dst: *dst, gateway: *gateway });
        }
    }
    for route in actual.iter().filter(|r| r.berth) {
        let wanted = desired.contains_key(&route.dst) && !foreign.contains(&route.dst);
        if !wanted {
            changes.push(Change::Delete { dst: route.dst, gateway: route.gateway });
        }
    }
    (changes, foreign)
}

/// The kernel's main routing table and this machine's addresses.
pub trait RouteTable {
    /// Every IPv4 unicast route of the main table.
    fn routes(&self) -> impl Future<Output = Result<Vec<KernelRoute>, RouteError>> + Send;
    /// Every IPv4 address of this machine, with its prefix.
    fn local_addresses(&self) -> impl Future<Output = Result<Vec<LocalAddress>, RouteError>> + Send;
    /// Adds or replaces the route to `dst`, tagged [`ROUTE_PROTOCOL`].
    fn replace(&self, dst: Ipv4Net, gateway: Ipv4Addr) -> impl Future<Output = Result<(), RouteError>> + Send;
    /// Deletes berth's route to `dst`; one already gone is fine.
    fn delete(&self, dst: Ipv4Net, gateway: Option<Ipv4Addr>) -> impl Future<Output = Result<(), RouteError>> + Send;
}

/// Keeps the routes in line with the Nodes.
pub struct Router<T> {
    table: T,
    /// The routes last made so, to skip the kernel when nothing changed.
    applied: Option<BTreeMap<Ipv4Net, Ipv4Addr>>,
    /// What has been logged, so each reason is logged once (again after it went away).
    reported: BTreeSet<Unroutable>,
    reported_foreign: BTreeSet<Ipv4Net>,
}

impl<T: RouteTable> Router<T> {
    pub fn new(table: T) -> Router<T> {
        Router { table, applied: None, reported: BTreeSet::new(), reported_foreign: BTreeSet::new() }
    }

    pub fn table(&self) -> &T {
        &self.table
    }

    /// Brings berth's routes in line with `nodes`; `forced` looks at the kernel even when the
    /// wanted routes did not change (someone may have removed one).
    pub async fn sync<'a>(&mut self, nodes: impl IntoIterator<Item = &'a Node>, own: &str, forced: bool) {
        let local = match self.table.local_addresses().await {
            Ok(local) => local,
            Err(e) => {
                tracing::warn!(error = %berth_common::error::error_chain(&e), "cannot read this machine's addresses");
                return;
            }
        };
        let desired = desired_routes(nodes, own, &local);
        let now: BTreeSet<Unroutable> = desired.unroutable.iter().cloned().collect();
        for reason in now.difference(&self.reported) {
            tracing::warn!("{reason}");
        }
        self.reported = now;
        if !forced && self.applied.as_ref() == Some(&desired.routes) {
            return;
        }
        let actual = match self.table.routes().await {
            Ok(actual) => actual,
            Err(e) => {
                tracing::warn!(error = %berth_common::error::error_chain(&e), "cannot read the routing table");
                return;
            }
        };
        let (changes, foreign) = plan(&desired.routes, &actual);
        let foreign: BTreeSet<Ipv4Net> = foreign.into_iter().collect();
        for dst in foreign.difference(&self.reported_foreign) {
            tracing::warn!(%dst, "a route berth did not make already leads to this pod CIDR; it is left alone");
        }
        self.reported_foreign = foreign;
        let mut all_done = true;
        for change in changes {
            let result = match &change {
                Change::Replace { dst, gateway } => self.table.replace(*dst, *gateway).await,
                Change::Delete { dst, gateway } => self.table.delete(*dst, *gateway).await,
            };
            match result {
                Ok(()) => tracing::info!(?change, "pod route changed"),
                Err(e) => {
                    all_done = false;
                    tracing::warn!(?change, error = %berth_common::error::error_chain(&e), "changing a pod route failed");
                }
            }
        }
        self.applied = all_done.then_some(desired.routes);
    }
}

/// The kernel's tables through rtnetlink.
#[derive(Clone)]
pub struct Netlink {
    handle: rtnetlink::Handle,
}

impl Netlink {
    /// A netlink socket served on the current Tokio runtime.
    pub fn connect() -> Result<Netlink, RouteError> {
        let (connection, handle, _) = rtnetlink::new_connection().map_err(RouteError::Connect)?;
        tokio::spawn(connection);
        Ok(Netlink { handle })
    }

    fn message(dst: Ipv4Net, gateway: Option<Ipv4Addr>) -> RouteMessage {
        let mut builder = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(dst.network, dst.prefix)
            .protocol(RouteProtocol::from(ROUTE_PROTOCOL));
        if let Some(gateway) = gateway {
            builder = builder.gateway(gateway);
        }
        builder.build()
    }
}

fn kernel_route(message: &RouteMessage) -> Option<KernelRoute> {
    let header = &message.header;
    if header.table != RouteHeader::RT_TABLE_MAIN || header.kind != RouteType::Unicast {
        return None;
    }
    let mut dst = Ipv4Addr::UNSPECIFIED;
    let mut gateway = None;
    for attribute in &message.attributes {
        match attribute {
            RouteAttribute::Destination(RouteAddress::Inet(a)) => dst = *a,
            RouteAttribute::Gateway(RouteAddress::Inet(g)) => gateway = Some(*g),
            RouteAttribute::Table(t) if *t != u32::from(RouteHeader::RT_TABLE_MAIN) => return None,
            _ => {}
        }
    }
    Some(KernelRoute {
        dst: Ipv4Net { network: dst, prefix: header.destination_prefix_length },
        gateway,
        berth: u8::from(header.protocol) == ROUTE_PROTOCOL,
    })
}

fn netlink(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> RouteError {
    let what = what.into();
    move |source| RouteError::Netlink { what, source }
}

impl RouteTable for Netlink {
    async fn routes(&self) -> Result<Vec<KernelRoute>, RouteError> {
        let all = RouteMessageBuilder::<Ipv4Addr>::new().build();
        let messages: Vec<RouteMessage> =
            self.handle.route().get(all).execute().try_collect().await.map_err(netlink("listing routes"))?;
        Ok(messages.iter().filter_map(kernel_route).collect())
    }

    async fn local_addresses(&self) -> Result<Vec<LocalAddress>, RouteError> {
        let messages: Vec<_> =
            self.handle.address().get().execute().try_collect().await.map_err(netlink("listing addresses"))?;
        Ok(messages
            .iter()
            .filter_map(|m| {
                let addr = m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Local(IpAddr::V4(v4)) | AddressAttribute::Address(IpAddr::V4(v4)) => Some(*v4),
                    _ => None,
                })?;
                Some(LocalAddress { addr, prefix: m.header.prefix_len })
            })
            .collect())
    }

    async fn replace(&self, dst: Ipv4Net, gateway: Ipv4Addr) -> Result<(), RouteError> {
        let message = Netlink::message(dst, Some(gateway));
        self.handle
            .route()
            .add(message)
            .replace()
            .execute()
            .await
            .map_err(netlink(format!("route {dst} via {gateway}")))
    }

    async fn delete(&self, dst: Ipv4Net, gateway: Option<Ipv4Addr>) -> Result<(), RouteError> {
        match self.handle.route().del(Netlink::message(dst, gateway)).execute().await {
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code().abs() == libc_esrch() => Ok(()),
            other => other.map_err(netlink(format!("deleting the route to {dst}"))),
        }
    }
}

/// "No such process": what the kernel answers for deleting a route that is not there.
fn libc_esrch() -> i32 {
    nix::errno::Errno::ESRCH as i32
}

/// Deletes every route berth made (every main-table route with [`ROUTE_PROTOCOL`]); returns
/// how many there were.
pub async fn remove_all_routes() -> Result<usize, RouteError> {
    let table = Netlink::connect()?;
    let ours: Vec<KernelRoute> = table.routes().await?.into_iter().filter(|r| r.berth).collect();
    for route in &ours {
        table.delete(route.dst, route.gateway).await?;
    }
    Ok(ours.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Mutex;

    fn node(name: &str, cidr: Option<&str>, ip: Option<&str>) -> Node {
        let addresses: Vec<_> = ip.into_iter().map(|ip| json!({"type": "InternalIP", "address": ip})).collect();
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": cidr.map(|c| json!({"podCIDR": c, "podCIDRs": [c]})).unwrap_or(json!({})),
            "status": {"addresses": addresses},
        }))
        .unwrap()
    }

    fn net(s: &str) -> Ipv4Net {
        Ipv4Net::parse(s).unwrap()
    }

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    const LOCAL: &[LocalAddress] = &[
        LocalAddress { addr: Ipv4Addr::new(127, 0, 0, 1), prefix: 8 },
        LocalAddress { addr: Ipv4Addr::new(192, 168, 1, 10), prefix: 24 },
    ];

    #[test]
    fn every_other_node_on_a_connected_network_gets_a_route_to_its_pod_cidr() {
        let nodes = [
            node("me", Some("10.244.0.0/24"), Some("192.168.1.10")),
            node("b", Some("10.244.1.0/24"), Some("192.168.1.11")),
            node("c", Some("10.244.2.0/24"), Some("192.168.1.12")),
        ];
        let desired = desired_routes(&nodes, "me", LOCAL);
        let expected =
            BTreeMap::from([(net("10.244.1.0/24"), ip("192.168.1.11")), (net("10.244.2.0/24"), ip("192.168.1.12"))]);
        assert_eq!(desired.routes, expected);
        assert!(desired.unroutable.is_empty());
    }

    #[test]
    fn nodes_without_a_pod_cidr_or_an_internal_ip_are_left_out_quietly() {
        let nodes = [node("b", None, Some("192.168.1.11")), node("c", Some("10.244.2.0/24"), None)];
        assert_eq!(desired_routes(&nodes, "me", LOCAL), Desired::default());
    }

    #[test]
    fn a_node_behind_a_router_or_at_our_own_address_is_unroutable_with_the_reason() {
        let nodes = [
            node("far", Some("10.244.1.0/24"), Some("10.0.0.5")),
            node("twin", Some("10.244.2.0/24"), Some("192.168.1.10")),
        ];
        let desired = desired_routes(&nodes, "me", LOCAL);
        assert!(desired.routes.is_empty());
        assert_eq!(
            desired.unroutable,
            [
                Unroutable::NotConnected { node: "far".into(), ip: ip("10.0.0.5") },
                Unroutable::OwnAddress { node: "twin".into(), ip: ip("192.168.1.10") },
            ]
        );
        assert!(desired.unroutable[0].to_string().contains("no directly connected network"));
    }

    #[test]
    fn the_plan_adds_missing_routes_replaces_moved_ones_and_deletes_stale_ones() {
        let desired = BTreeMap::from([
            (net("10.244.1.0/24"), ip("192.168.1.11")),
            (net("10.244.2.0/24"), ip("192.168.1.22")),
            (net("10.244.3.0/24"), ip("192.168.1.13")),
        ]);
        let actual = [
            KernelRoute { dst: net("10.244.2.0/24"), gateway: Some(ip("192.168.1.12")), berth: true },
            KernelRoute { dst: net("10.244.3.0/24"), gateway: Some(ip("192.168.1.13")), berth: true },
            KernelRoute { dst: net("10.244.9.0/24"), gateway: Some(ip("192.168.1.19")), berth: true },
            KernelRoute { dst: net("0.0.0.0/0"), gateway: Some(ip("192.168.1.1")), berth: false },
        ];
        let (changes, foreign) = plan(&desired, &actual);
        assert_eq!(
            changes,
            [
                Change::Replace { dst: net("10.244.1.0/24"), gateway: ip("192.168.1.11") },
                Change::Replace { dst: net("10.244.2.0/24"), gateway: ip("192.168.1.22") },
                Change::Delete { dst: net("10.244.9.0/24"), gateway: Some(ip("192.168.1.19")) },
            ]
        );
        assert!(foreign.is_empty());
    }

    #[test]
    fn a_route_someone_else_made_to_a_pod_cidr_is_left_alone() {
        let desired = BTreeMap::from([(net("10.244.1.0/24"), ip("192.168.1.11"))]);
        let actual = [KernelRoute { dst: net("10.244.1.0/24"), gateway: None, berth: false }];
        assert_eq!(plan(&desired, &actual), (vec![], vec![net("10.244.1.0/24")]));
    }

    /// A routing table in memory that records the changes asked of it.
    #[derive(Default)]
    struct FakeTable {
        routes: Mutex<Vec<KernelRoute>>,
        calls: Mutex<Vec<Change>>,
    }

    impl RouteTable for FakeTable {
        async fn routes(&self) -> Result<Vec<KernelRoute>, RouteError> {
            Ok(self.routes.lock().unwrap().clone())
        }
        async fn local_addresses(&self) -> Result<Vec<LocalAddress>, RouteError> {
            Ok(LOCAL.to_vec())
        }
        async fn replace(&self, dst: Ipv4Net, gateway: Ipv4Addr) -> Result<(), RouteError> {
            self.calls.lock().unwrap().push(Change::Replace { dst, gateway });
            let mut routes = self.routes.lock().unwrap();
            routes.retain(|r| r.dst != dst);
            routes.push(KernelRoute { dst, gateway: Some(gateway), berth: true });
            Ok(())
        }
        async fn delete(&self, dst: Ipv4Net, gateway: Option<Ipv4Addr>) -> Result<(), RouteError> {
            self.calls.lock().unwrap().push(Change::Delete { dst, gateway });
            self.routes.lock().unwrap().retain(|r| r.dst != dst);
            Ok(())
        }
    }

    #[tokio::test]
    async fn the_router_follows_nodes_appearing_moving_and_going() {
        let mut router = Router::new(FakeTable::default());
        let b = node("b", Some("10.244.1.0/24"), Some("192.168.1.11"));
        router.sync([&b], "me", false).await;
        let moved = node("b", Some("10.244.1.0/24"), Some("192.168.1.21"));
        router.sync([&moved], "me", false).await;
        router.sync([&moved], "me", false).await;
        router.sync([], "me", false).await;
        assert_eq!(
            *router.table().calls.lock().unwrap(),
            [
                Change::Replace { dst: net("10.244.1.0/24"), gateway: ip("192.168.1.11") },
                Change::Replace { dst: net("10.244.1.0/24"), gateway: ip("192.168.1.21") },
                Change::Delete { dst: net("10.244.1.0/24"), gateway: Some(ip("192.168.1.21")) },
            ],
            "an unchanged node list changes nothing"
        );
    }

    #[tokio::test]
    async fn a_forced_sync_puts_back_a_route_someone_removed() {
        let mut router = Router::new(FakeTable::default());
        let b = node("b", Some("10.244.1.0/24"), Some("192.168.1.11"));
        router.sync([&b], "me", false).await;
        router.table().routes.lock().unwrap().clear();
        router.sync([&b], "me", true).await;
        assert_eq!(router.table().calls.lock().unwrap().len(), 2);
        assert_eq!(router.table().routes.lock().unwrap()[0].gateway, Some(ip("192.168.1.11")));
    }
}
