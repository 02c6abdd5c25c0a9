//! The result of a CNI ADD, parsed from the shapes of spec versions 0.1.0 to 1.0.0.
//!
//! Versions 0.3.0 to 1.0.0 share one shape (`interfaces`, `ips` with CIDR `address`, `routes`,
//! `dns`; 0.3.x/0.4.0 also carry a `version` per IP); 0.1.0/0.2.0 have `ip4`/`ip6` objects instead,
//! which are converted. The raw JSON is kept: it is what the next plugin gets as `prevResult`.

use std::net::IpAddr;

use serde::Deserialize;
use serde_json::Value;

/// A result that is not one of the CNI result shapes.
#[derive(Debug, thiserror::Error)]
pub enum ResultError {
    #[error("CNI result is not valid JSON of a known result shape")]
    Shape(#[source] serde_json::Error),
    #[error("CNI result has an invalid CIDR {cidr:?}")]
    Cidr { cidr: String },
    #[error("no CNI plugin printed a result")]
    Missing,
}

/// An interface the plugins created or configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub mac: Option<String>,
    /// The netns path for an interface inside the container; `None` for host-side interfaces.
    pub sandbox: Option<String>,
}

/// An address assigned by the plugins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    pub address: IpAddr,
    pub prefix_len: u8,
    pub gateway: Option<IpAddr>,
    /// Index into [`CniResult::interfaces`] of the interface that has the address.
    pub interface: Option<usize>,
}

/// A route the plugins set up in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub dst: IpAddr,
    pub dst_prefix_len: u8,
    pub gw: Option<IpAddr>,
}

/// DNS settings the plugins suggest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Dns {
    pub nameservers: Vec<String>,
    pub domain: Option<String>,
    pub search: Vec<String>,
    pub options: Vec<String>,
}

/// The final result of attaching a container to a network.
#[derive(Debug, Clone, PartialEq)]
pub struct CniResult {
    pub cni_version: String,
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
    /// The result exactly as the last plugin printed it.
    pub raw: Value,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    #[serde(default)]
    cni_version: String,
    #[serde(default)]
    interfaces: Vec<WireInterface>,
    #[serde(default)]
    ips: Vec<WireIp>,
    #[serde(default)]
    routes: Vec<WireRoute>,
    #[serde(default)]
    dns: Dns,
    ip4: Option<WireLegacyIp>,
    ip6: Option<WireLegacyIp>,
}

#[derive(Deserialize)]
struct WireInterface {
    name: String,
    mac: Option<String>,
    sandbox: Option<String>,
}

#[derive(Deserialize)]
struct WireIp {
    address: String,
    gateway: Option<IpAddr>,
    interface: Option<usize>,
}

#[derive(Deserialize)]
struct WireRoute {
    dst: String,
    gw: Option<IpAddr>,
}

#[derive(Deserialize)]
struct WireLegacyIp {
    ip: String,
    gateway: Option<IpAddr>,
    #[serde(default)]
    routes: Vec<WireRoute>,
}

/// Splits `10.88.0.5/16` into the address and the prefix length.
pub(crate) fn parse_cidr(cidr: &str) -> Result<(IpAddr, u8), ResultError> {
    let bad = || ResultError::Cidr { cidr: cidr.to_owned() };
    let (addr, prefix) = cidr.split_once('/').ok_or_else(bad)?;
    let addr: IpAddr = addr.parse().map_err(|_| bad())?;
    let prefix: u8 = prefix.parse().map_err(|_| bad())?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if prefix > max {
        return Err(bad());
    }
    Ok((addr, prefix))
}

impl WireRoute {
    fn parse(self) -> Result<Route, ResultError> {
        let (dst, dst_prefix_len) = parse_cidr(&self.dst)?;
        Ok(Route { dst, dst_prefix_len, gw: self.gw })
    }
}

impl CniResult {
    /// Parses a plugin's result.
    pub fn from_json(raw: Value) -> Result<Self, ResultError> {
        let wire = Wire::deserialize(&raw).map_err(ResultError::Shape)?;
        let interfaces = wire
            .interfaces
            .into_iter()
            .map(|i| Interface { name: i.name, mac: i.mac, sandbox: i.sandbox.filter(|s| !s.is_empty()) })
            .collect();
        let mut ips = Vec::new();
        let mut routes = Vec::new();
        for ip in wire.ips {
            let (address, prefix_len) = parse_cidr(&ip.address)?;
            ips.push(IpConfig { address, prefix_len, gateway: ip.gateway, interface: ip.interface });
        }
        for route in wire.routes {
            routes.push(route.parse()?);
        }
        for legacy in [wire.ip4, wire.ip6].into_iter().flatten() {
            let (address, prefix_len) = parse_cidr(&legacy.ip)?;
            ips.push(IpConfig { address, prefix_len, gateway: legacy.gateway, interface: None });
            for route in legacy.routes {
                routes.push(route.parse()?);
            }
        }
        Ok(Self { cni_version: wire.cni_version, interfaces, ips, routes, dns: wire.dns, raw })
    }

    /// The addresses inside the container (on an interface with a sandbox), or all of them when
    /// the result does not say which interface holds which address.
    pub fn sandbox_ips(&self) -> Vec<&IpConfig> {
        let in_sandbox = |ip: &&IpConfig| match ip.interface.and_then(|i| self.interfaces.get(i)) {
            Some(interface) => interface.sandbox.is_some(),
            None => true,
        };
        self.ips.iter().filter(in_sandbox).collect()
    }

    /// The pod IP: the first IPv4 address in the container, else the first IPv6 one.
    pub fn pod_ip(&self) -> Option<IpAddr> {
        let ips = self.sandbox_ips();
        ips.iter().find(|ip| ip.address.is_ipv4()).or(ips.first()).map(|ip| ip.address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_bridge_result_of_spec_1_0_0_is_parsed() {
        let raw = json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "berth0", "mac": "aa:bb:cc:dd:ee:ff"},
                {"name": "veth1234", "mac": "11:22:33:44:55:66"},
                {"name": "eth0", "mac": "66:55:44:33:22:11", "sandbox": "/run/berth/netns/pod"}
            ],
            "ips": [{"interface": 2, "address": "10.88.0.5/16", "gateway": "10.88.0.1"}],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {"nameservers": ["10.96.0.10"]}
        });
        let result = CniResult::from_json(raw.clone()).unwrap();
        assert_eq!(result.cni_version, "1.0.0");
        assert_eq!(result.interfaces[2].sandbox.as_deref(), Some("/run/berth/netns/pod"));
        assert_eq!(result.interfaces[0].sandbox, None);
        let ip = &result.ips[0];
        assert_eq!((ip.address, ip.prefix_len), ("10.88.0.5".parse().unwrap(), 16));
        assert_eq!(ip.gateway, Some("10.88.0.1".parse().unwrap()));
        assert_eq!(result.routes[0].dst_prefix_len, 0);
        assert_eq!(result.dns.nameservers, ["10.96.0.10"]);
        assert_eq!(result.pod_ip(), Some("10.88.0.5".parse().unwrap()));
        assert_eq!(result.raw, raw);
    }

    #[test]
    fn a_spec_0_4_0_result_with_ip_versions_is_parsed() {
        let raw = json!({
            "cniVersion": "0.4.0",
            "interfaces": [{"name": "eth0", "sandbox": "/x"}],
            "ips": [
                {"version": "6", "interface": 0, "address": "fd00::5/64"},
                {"version": "4", "interface": 0, "address": "10.1.0.5/24", "gateway": "10.1.0.1"}
            ]
        });
        let result = CniResult::from_json(raw).unwrap();
        assert_eq!(result.ips.len(), 2);
        assert_eq!(result.pod_ip(), Some("10.1.0.5".parse().unwrap()), "IPv4 is preferred as the pod IP");
    }

    #[test]
    fn a_legacy_0_2_0_result_is_converted() {
        let raw = json!({
            "cniVersion": "0.2.0",
            "ip4": {"ip": "10.2.0.7/16", "gateway": "10.2.0.1", "routes": [{"dst": "0.0.0.0/0", "gw": "10.2.0.1"}]},
            "dns": {}
        });
        let result = CniResult::from_json(raw).unwrap();
        assert_eq!(result.pod_ip(), Some("10.2.0.7".parse().unwrap()));
        assert_eq!(result.routes[0].gw, Some("10.2.0.1".parse().unwrap()));
    }

    #[test]
    fn host_side_addresses_are_not_pod_ips() {
        let raw = json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "br"}, {"name": "eth0", "sandbox": "/ns"}],
            "ips": [{"interface": 0, "address": "10.0.0.1/24"}, {"interface": 1, "address": "10.0.0.9/24"}]
        });
        let result = CniResult::from_json(raw).unwrap();
        assert_eq!(result.pod_ip(), Some("10.0.0.9".parse().unwrap()));
    }

    #[test]
    fn bad_cidrs_and_shapes_are_errors() {
        for cidr in ["10.0.0.1", "10.0.0.1/33", "x/8", "fd00::1/129"] {
            assert!(parse_cidr(cidr).is_err(), "{cidr}");
        }
        assert!(matches!(CniResult::from_json(json!({"ips": "nope"})), Err(ResultError::Shape(_))));
        let bad_ip = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.1"}]});
        assert!(matches!(CniResult::from_json(bad_ip), Err(ResultError::Cidr { .. })));
    }
}
