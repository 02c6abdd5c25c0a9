//! A pod's DNS configuration (`dnsPolicy`, `dnsConfig`) as CRI `DNSConfig`, the way kubelet builds
//! it: `ClusterFirst` pods ask the cluster DNS and search their namespace's Services first; without
//! `--cluster-dns` they use the node's resolver, as kubelet does.

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1 as core;

/// kubelet's limits (`validation.MaxDNSNameservers`, `MaxDNSSearchPaths`).
const MAX_NAMESERVERS: usize = 3;
const MAX_SEARCHES: usize = 32;

/// What the node's resolv.conf says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostDns {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

impl HostDns {
    /// Parses resolv.conf text: `nameserver`, `search` (the last one wins, as in glibc), `domain`,
    /// `options`; comments and unknown lines are skipped.
    pub fn parse(text: &str) -> HostDns {
        let mut dns = HostDns::default();
        for line in text.lines() {
            let line = line.split(['#', ';']).next().unwrap_or("");
            let mut fields = line.split_whitespace();
            match fields.next() {
                Some("nameserver") => dns.servers.extend(fields.next().map(String::from)),
                Some("search") | Some("domain") => dns.searches = fields.map(String::from).collect(),
                Some("options") => dns.options.extend(fields.map(String::from)),
                _ => {}
            }
        }
        dns
    }

    /// The node's `/etc/resolv.conf` (empty when unreadable).
    pub fn from_host() -> HostDns {
        HostDns::parse(&std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default())
    }
}

/// The node's resolver and the cluster's DNS, as pods on this node see them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeDns {
    pub host: HostDns,
    /// The cluster DNS servers (`--cluster-dns`); empty when there is none.
    pub cluster_servers: Vec<String>,
    /// `--cluster-domain`, e.g. `cluster.local`.
    pub cluster_domain: String,
}

/// The CRI DNS config for a pod in `namespace` on a node with `dns`.
pub fn dns_config(spec: &core::PodSpec, namespace: &str, dns: &NodeDns) -> cri::DnsConfig {
    let host = &dns.host;
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let host_network = spec.host_network == Some(true);
    // kubelet: a host-network pod asks the cluster DNS only with ClusterFirstWithHostNet.
    let cluster = match policy {
        "ClusterFirst" => !host_network,
        "ClusterFirstWithHostNet" => true,
        _ => false,
    } && !dns.cluster_servers.is_empty();
    let mut dns = match policy {
        "None" => cri::DnsConfig::default(),
        _ if cluster => {
            let domain = &dns.cluster_domain;
            let mut searches = vec![format!("{namespace}.svc.{domain}"), format!("svc.{domain}"), domain.clone()];
            searches.extend(host.searches.iter().filter(|s| !searches.contains(s)).cloned().collect::<Vec<_>>());
            cri::DnsConfig { servers: dns.cluster_servers.clone(), searches, options: vec!["ndots:5".into()] }
        }
        // Default, and the cluster policies without cluster DNS: the node's resolver.
        _ => cri::DnsConfig {
            servers: host.servers.clone(),
            searches: host.searches.clone(),
            options: host.options.clone(),
        },
    };
    if let Some(extra) = &spec.dns_config {
        for server in extra.nameservers.iter().flatten() {
            if !dns.servers.contains(server) {
                dns.servers.push(server.clone());
            }
        }
        for search in extra.searches.iter().flatten() {
            if !dns.searches.contains(search) {
                dns.searches.push(search.clone());
            }
        }
        for opt in extra.options.iter().flatten() {
            let Some(name) = opt.name.as_deref() else { continue };
            let rendered = match &opt.value {
                Some(v) => format!("{name}:{v}"),
                None => name.to_string(),
            };
            // The pod's option replaces the node's option of the same name.
            dns.options.retain(|o| o.split(':').next() != Some(name));
            dns.options.push(rendered);
        }
    }
    dns.servers.truncate(MAX_NAMESERVERS);
    dns.searches.truncate(MAX_SEARCHES);
    dns
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> NodeDns {
        NodeDns {
            host: HostDns::parse(
                "# generated\nnameserver 10.0.0.2\nnameserver 10.0.0.3 ; second\nsearch corp.example example\noptions ndots:2 edns0\n",
            ),
            ..NodeDns::default()
        }
    }

    fn cluster() -> NodeDns {
        NodeDns { cluster_servers: vec!["10.96.0.10".into()], cluster_domain: "cluster.local".into(), ..host() }
    }

    fn pod(policy: Option<&str>, config: Option<core::PodDNSConfig>) -> core::PodSpec {
        core::PodSpec { dns_policy: policy.map(String::from), dns_config: config, ..Default::default() }
    }

    fn option(name: &str, value: Option<&str>) -> core::PodDNSConfigOption {
        core::PodDNSConfigOption { name: Some(name.into()), value: value.map(String::from) }
    }

    #[test]
    fn resolv_conf_is_parsed_with_comments_and_the_last_search_line() {
        let h = HostDns::parse("search a\nnameserver 1.1.1.1\nsearch b c\n#nameserver 9.9.9.9\noptions rotate\n");
        assert_eq!(h.servers, vec!["1.1.1.1"]);
        assert_eq!(h.searches, vec!["b", "c"]);
        assert_eq!(h.options, vec!["rotate"]);
    }

    #[test]
    fn cluster_first_without_cluster_dns_and_default_use_the_nodes_resolver() {
        for policy in [None, Some("ClusterFirst"), Some("Default"), Some("ClusterFirstWithHostNet")] {
            let dns = dns_config(&pod(policy, None), "ns", &host());
            assert_eq!(dns.servers, vec!["10.0.0.2", "10.0.0.3"], "{policy:?}");
            assert_eq!(dns.searches, vec!["corp.example", "example"]);
            assert_eq!(dns.options, vec!["ndots:2", "edns0"]);
        }
    }

    #[test]
    fn none_uses_exactly_the_pods_dns_config() {
        let config = core::PodDNSConfig {
            nameservers: Some(vec!["192.0.2.1".into()]),
            searches: Some(vec!["ns1.svc.example".into()]),
            options: Some(vec![option("ndots", Some("5"))]),
        };
        let dns = dns_config(&pod(Some("None"), Some(config)), "ns", &host());
        assert_eq!(dns.servers, vec!["192.0.2.1"]);
        assert_eq!(dns.searches, vec!["ns1.svc.example"]);
        assert_eq!(dns.options, vec!["ndots:5"]);
        assert_eq!(dns_config(&pod(Some("None"), None), "ns", &host()), cri::DnsConfig::default());
    }

    #[test]
    fn a_dns_config_merges_into_the_nodes_with_pod_options_winning_and_at_most_three_servers() {
        let config = core::PodDNSConfig {
            nameservers: Some(vec!["10.0.0.2".into(), "192.0.2.1".into(), "192.0.2.2".into()]),
            searches: Some(vec!["extra".into()]),
            options: Some(vec![option("ndots", Some("1")), option("single-request", None)]),
        };
        let dns = dns_config(&pod(Some("Default"), Some(config)), "ns", &host());
        assert_eq!(dns.servers, vec!["10.0.0.2", "10.0.0.3", "192.0.2.1"]);
        assert_eq!(dns.searches, vec!["corp.example", "example", "extra"]);
        assert_eq!(dns.options, vec!["edns0", "ndots:1", "single-request"]);
    }

    #[test]
    fn cluster_first_pods_ask_the_cluster_dns_and_search_their_namespace_first() {
        let dns = dns_config(&pod(None, None), "team", &cluster());
        assert_eq!(dns.servers, vec!["10.96.0.10"]);
        assert_eq!(
            dns.searches,
            vec!["team.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example", "example"]
        );
        assert_eq!(dns.options, vec!["ndots:5"]);
    }

    #[test]
    fn host_network_pods_ask_the_cluster_dns_only_with_cluster_first_with_host_net() {
        let mut spec = pod(Some("ClusterFirst"), None);
        spec.host_network = Some(true);
        assert_eq!(dns_config(&spec, "ns", &cluster()).servers, vec!["10.0.0.2", "10.0.0.3"]);
        spec.dns_policy = Some("ClusterFirstWithHostNet".into());
        assert_eq!(dns_config(&spec, "ns", &cluster()).servers, vec!["10.96.0.10"]);
        assert_eq!(dns_config(&pod(Some("Default"), None), "ns", &cluster()).servers, vec!["10.0.0.2", "10.0.0.3"]);
    }
}
