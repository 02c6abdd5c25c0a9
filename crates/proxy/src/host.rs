//! The kernel settings the proxy's rules rely on, checked (and set where that is safe) at start,
//! with what to do about each one that is missing.

use std::path::Path;

/// Forwarding between interfaces: pods' traffic to other nodes and NodePort traffic to pods.
const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
/// Bridged traffic through the IP hooks: without it, a reply from a pod to a pod on the same
/// bridge skips conntrack, so a connection through a Service between them never completes.
const BRIDGE_NF_CALL_IPTABLES: &str = "/proc/sys/net/bridge/bridge-nf-call-iptables";

/// What is missing on this host, one sentence each; empty when all is well. `nft` and
/// `conntrack` are the binaries the proxy runs.
pub async fn check(nft: &Path, conntrack: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    match tokio::process::Command::new(nft).arg("--version").output().await {
        Ok(out) if out.status.success() => {}
        Ok(out) => problems.push(format!(
            "{} --version failed: {}",
            nft.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => problems.push(format!(
            "cannot run {} ({e}): install nftables (apt-get install nftables) for the service proxy",
            nft.display()
        )),
    }
    if let Err(e) = tokio::process::Command::new(conntrack).arg("--version").output().await {
        problems.push(format!(
            "cannot run {} ({e}): install conntrack (apt-get install conntrack), or UDP clients of a Service \
             keep sending to an endpoint that left until they pause",
            conntrack.display()
        ));
    }
    if !Path::new(BRIDGE_NF_CALL_IPTABLES).exists() {
        // A distribution kernel builds bridge netfilter as a module that nothing loads by itself.
        let loaded = tokio::process::Command::new("modprobe").arg("br_netfilter").status().await;
        tracing::info!(ok = loaded.is_ok_and(|s| s.success()), "service proxy: modprobe br_netfilter");
    }
    for (path, why) in [
        (IP_FORWARD, "pods cannot reach Services on other nodes, nor NodePorts reach pods"),
        (BRIDGE_NF_CALL_IPTABLES, "pods cannot reach Services whose endpoint is on the same bridge"),
    ] {
        if let Some(problem) = ensure_one(Path::new(path), why) {
            problems.push(problem);
        }
    }
    problems
}

/// Sets a sysctl to 1 when it is 0; a sentence when that cannot be done.
fn ensure_one(path: &Path, why: &str) -> Option<String> {
    let name = sysctl_name(path);
    let value = match std::fs::read_to_string(path) {
        Ok(v) => v,
        Err(_) if path.starts_with("/proc/sys/net/bridge") => {
            return Some(format!("{name} is missing (load the br_netfilter module: modprobe br_netfilter): {why}"));
        }
        Err(e) => return Some(format!("cannot read {name}: {e}: {why}")),
    };
    if value.trim() == "1" {
        return None;
    }
    match std::fs::write(path, "1") {
        Ok(()) => {
            tracing::info!(sysctl = %name, "set to 1 for the service proxy");
            None
        }
        Err(e) => Some(format!("{name} is {} and cannot be set ({e}; sysctl -w {name}=1): {why}", value.trim())),
    }
}

fn sysctl_name(path: &Path) -> String {
    path.strip_prefix("/proc/sys").unwrap_or(path).display().to_string().replace('/', ".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysctl_names_are_written_as_sysctl_spells_them() {
        assert_eq!(sysctl_name(Path::new(BRIDGE_NF_CALL_IPTABLES)), "net.bridge.bridge-nf-call-iptables");
    }

    #[tokio::test]
    async fn missing_nft_and_conntrack_binaries_are_named_with_how_to_install_them() {
        let problems = check(Path::new("/nonexistent/nft"), Path::new("/nonexistent/conntrack")).await;
        assert!(problems.iter().any(|p| p.contains("apt-get install nftables")), "{problems:?}");
        assert!(problems.iter().any(|p| p.contains("apt-get install conntrack")), "{problems:?}");
    }
}
