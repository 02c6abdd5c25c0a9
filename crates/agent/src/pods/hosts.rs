//! The pod's `/etc/hosts`, as kubelet manages it: one file per pod, mounted into each container
//! that does not mount its own there. For a pod on its own network: localhost, the IPv6 names and
//! the pod's IPs under its hostname; on the host network: the node's own hosts file. Either way
//! followed by the pod's `hostAliases`.

use k8s_openapi::api::core::v1 as core;

/// Where containers see the file.
pub const ETC_HOSTS: &str = "/etc/hosts";

/// The pod's hostname as kubelet sets it: `spec.hostname`, else the pod's name, cut to 63
/// characters without a trailing `-` or `.`.
pub fn pod_hostname(pod: &core::Pod) -> String {
    let spec = pod.spec.as_ref();
    let name = spec.and_then(|s| s.hostname.clone()).filter(|h| !h.is_empty());
    let name = name.unwrap_or_else(|| pod.metadata.name.clone().unwrap_or_default());
    if name.len() <= 63 {
        return name;
    }
    name[..63].trim_end_matches(['-', '.']).to_string()
}

/// The file's content. `node_hosts` is the node's `/etc/hosts` (used on the host network); a pod
/// with a `subdomain` is also listed under its fully qualified name in `cluster_domain`.
pub fn content(pod: &core::Pod, pod_ips: &[String], node_hosts: &str, cluster_domain: &str) -> String {
    let spec = pod.spec.as_ref();
    let mut out = String::new();
    if spec.and_then(|s| s.host_network).unwrap_or(false) {
        out.push_str("# Kubernetes-managed hosts file (host network).\n");
        out.push_str(node_hosts);
        if !node_hosts.is_empty() && !node_hosts.ends_with('\n') {
            out.push('\n');
        }
    } else {
        out.push_str(
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
             fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n",
        );
        let hostname = pod_hostname(pod);
        let subdomain = spec.and_then(|s| s.subdomain.as_deref()).filter(|s| !s.is_empty());
        let names = match subdomain {
            Some(sub) => {
                let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
                format!("{hostname}.{sub}.{ns}.svc.{cluster_domain}\t{hostname}")
            }
            None => hostname,
        };
        for ip in pod_ips {
            out.push_str(&format!("{ip}\t{names}\n"));
        }
    }
    let aliases = spec.and_then(|s| s.host_aliases.as_ref()).filter(|a| !a.is_empty());
    if let Some(aliases) = aliases {
        out.push_str("\n# Entries added by HostAliases.\n");
        for alias in aliases {
            let names = alias.hostnames.as_deref().unwrap_or_default();
            out.push_str(&format!("{}\t{}\n", alias.ip, names.join("\t")));
        }
    }
    out
}

/// Whether the container gets the pod's file: not when it mounts something at `/etc/hosts`
/// itself, nor before the pod has an IP.
pub fn mounted_for(container: &core::Container, pod_ips: &[String]) -> bool {
    !pod_ips.is_empty() && container.volume_mounts.iter().flatten().all(|m| m.mount_path != ETC_HOSTS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> core::Pod {
        serde_json::from_value(json!({"metadata": {"name": "web-0", "namespace": "ns"}, "spec": spec})).unwrap()
    }

    #[test]
    fn a_pod_network_pod_gets_kubelets_managed_file_with_its_ips_and_aliases() {
        let p = pod(json!({"containers": [], "hostAliases": [
            {"ip": "123.45.67.89", "hostnames": ["foo", "bar"]}, {"ip": "10.0.0.9", "hostnames": ["baz"]}]}));
        assert_eq!(
            content(&p, &["10.88.0.7".into()], "ignored", "cluster.local"),
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
             fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n\
             10.88.0.7\tweb-0\n\n# Entries added by HostAliases.\n123.45.67.89\tfoo\tbar\n10.0.0.9\tbaz\n"
        );
    }

    #[test]
    fn a_host_network_pod_gets_the_nodes_file_and_its_aliases() {
        let p =
            pod(json!({"containers": [], "hostNetwork": true, "hostAliases": [{"ip": "1.2.3.4", "hostnames": ["a"]}]}));
        assert_eq!(
            content(&p, &["192.0.2.2".into()], "127.0.0.1 localhost\n192.0.2.2 node-a", "cluster.local"),
            "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n192.0.2.2 node-a\n\n\
             # Entries added by HostAliases.\n1.2.3.4\ta\n"
        );
    }

    #[test]
    fn the_hostname_is_the_spec_hostname_else_the_name_cut_to_63_characters() {
        assert_eq!(pod_hostname(&pod(json!({"containers": [], "hostname": "h"}))), "h");
        let long = format!("{}-{}", "a".repeat(62), "b");
        let p: core::Pod =
            serde_json::from_value(json!({"metadata": {"name": long}, "spec": {"containers": []}})).unwrap();
        assert_eq!(pod_hostname(&p), "a".repeat(62));
    }

    #[test]
    fn a_container_mounting_its_own_hosts_file_or_a_pod_without_ip_gets_none() {
        let own: core::Container = serde_json::from_value(json!({"name": "c", "volumeMounts": [
            {"name": "v", "mountPath": "/etc/hosts"}]}))
        .unwrap();
        let plain: core::Container = serde_json::from_value(json!({"name": "c"})).unwrap();
        let ips = vec!["10.88.0.7".to_string()];
        assert!(!mounted_for(&own, &ips));
        assert!(mounted_for(&plain, &ips));
        assert!(!mounted_for(&plain, &[]));
    }

    #[test]
    fn a_pod_with_a_subdomain_is_listed_under_its_fully_qualified_name_too() {
        let p: core::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-0", "namespace": "team"},
            "spec": {"hostname": "web-0", "subdomain": "web", "containers": []}
        }))
        .unwrap();
        let text = content(&p, &["10.244.0.7".into()], "ignored", "cluster.local");
        assert!(text.contains("10.244.0.7\tweb-0.web.team.svc.cluster.local\tweb-0\n"), "{text}");
    }
}
