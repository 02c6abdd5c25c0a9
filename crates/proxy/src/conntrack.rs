//! UDP flows that would keep going to endpoints that are gone (kube-proxy's conntrack cleanup).
//!
//! A UDP "connection" lives in conntrack as long as its client keeps sending, and the DNAT it
//! got stays with it: a client of a Service whose endpoint left would keep sending to it (or,
//! having sent while the Service had no endpoints, into nothing). Once the rules changed, the
//! proxy deletes those entries with `conntrack -D`; the next packet is NATed afresh.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::Path;

use crate::rules::ServiceRules;

/// Where UDP clients reach a Service: a ClusterIP or external IP and port, or a NodePort on
/// any of the node's addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UdpFront {
    Address(Ipv4Addr, u16),
    NodePort(u16),
}

/// Each UDP front of a Service and the endpoint addresses its traffic may be DNATed to.
pub type UdpFronts = BTreeMap<UdpFront, BTreeSet<Ipv4Addr>>;

/// Conntrack entries to delete: UDP to `front`, DNATed to `endpoint` (`None`: any entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct StaleFlows {
    pub front: UdpFront,
    pub endpoint: Option<Ipv4Addr>,
}

impl StaleFlows {
    /// The `conntrack` arguments that delete them.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec!["-D".to_string(), "-p".into(), "udp".into()];
        match self.front {
            UdpFront::Address(ip, port) => {
                args.extend(["--orig-dst".into(), ip.to_string(), "--orig-port-dst".into(), port.to_string()])
            }
            UdpFront::NodePort(port) => args.extend(["--orig-port-dst".into(), port.to_string()]),
        }
        if let Some(ep) = self.endpoint {
            args.extend(["--reply-src".into(), ep.to_string()]);
        }
        args
    }
}

/// The flows a Service's change from `old` to `new` leaves stale: those to endpoints a front no
/// longer uses, and every flow to a front that had no endpoint and now has one.
pub fn stale(old: Option<&ServiceRules>, new: Option<&ServiceRules>) -> Vec<StaleFlows> {
    let none = UdpFronts::new();
    let old = old.map_or(&none, |r| &r.udp_fronts);
    let new = new.map_or(&none, |r| &r.udp_fronts);
    let mut out = Vec::new();
    for (front, endpoints) in old {
        let kept = new.get(front);
        for ep in endpoints.iter().filter(|ep| !kept.is_some_and(|k| k.contains(*ep))) {
            out.push(StaleFlows { front: *front, endpoint: Some(*ep) });
        }
    }
    for (front, endpoints) in new {
        if !endpoints.is_empty() && old.get(front).is_none_or(BTreeSet::is_empty) {
            out.push(StaleFlows { front: *front, endpoint: None });
        }
    }
    out
}

/// Deletes `flows` with the `conntrack` binary, one run each; failures are logged, not returned
/// (a flow left behind only delays its client until it stops sending).
pub async fn clear(conntrack: &Path, flows: &[StaleFlows]) {
    for flow in flows {
        let args = flow.args();
        match tokio::process::Command::new(conntrack).args(&args).output().await {
            Ok(out) if out.status.success() => {}
            // It exits 1 when nothing matched.
            Ok(out) if String::from_utf8_lossy(&out.stderr).contains(" 0 flow entries") => {}
            Ok(out) => tracing::warn!(
                command = %format!("{} {}", conntrack.display(), args.join(" ")),
                stderr = %String::from_utf8_lossy(&out.stderr).trim(),
                "service proxy: cannot delete stale UDP flows"
            ),
            Err(e) => tracing::warn!(
                program = %conntrack.display(), error = %e,
                "service proxy: cannot run conntrack; stale UDP flows stay until their clients pause"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(fronts: &[(UdpFront, &[&str])]) -> ServiceRules {
        let udp_fronts = fronts.iter().map(|(f, eps)| (*f, eps.iter().map(|e| e.parse().unwrap()).collect())).collect();
        ServiceRules { udp_fronts, ..ServiceRules::default() }
    }

    const DNS: UdpFront = UdpFront::Address(Ipv4Addr::new(10, 96, 0, 10), 53);

    #[test]
    fn an_endpoint_that_leaves_makes_its_flows_stale_and_the_others_stay() {
        let old = rules(&[(DNS, &["10.244.0.2", "10.244.0.3"])]);
        let new = rules(&[(DNS, &["10.244.0.3"])]);
        let flows = stale(Some(&old), Some(&new));
        assert_eq!(flows, [StaleFlows { front: DNS, endpoint: Some("10.244.0.2".parse().unwrap()) }]);
        assert_eq!(
            flows[0].args().join(" "),
            "-D -p udp --orig-dst 10.96.0.10 --orig-port-dst 53 --reply-src 10.244.0.2"
        );
    }

    #[test]
    fn a_front_that_gets_its_first_endpoint_loses_every_flow_it_had() {
        let old = rules(&[(UdpFront::NodePort(30053), &[])]);
        let new = rules(&[(UdpFront::NodePort(30053), &["10.244.0.3"])]);
        let flows = stale(Some(&old), Some(&new));
        assert_eq!(flows, [StaleFlows { front: UdpFront::NodePort(30053), endpoint: None }]);
        assert_eq!(flows[0].args().join(" "), "-D -p udp --orig-port-dst 30053");
        assert_eq!(stale(None, Some(&new)).len(), 1, "a new Service too");
    }

    #[test]
    fn a_deleted_service_makes_every_flow_to_its_endpoints_stale_and_an_unchanged_one_none() {
        let old = rules(&[(DNS, &["10.244.0.2"])]);
        assert_eq!(stale(Some(&old), None).len(), 1);
        assert!(stale(Some(&old), Some(&old)).is_empty());
    }
}
