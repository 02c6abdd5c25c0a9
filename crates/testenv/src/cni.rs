//! CNI bridge networks for the runtimes that tests and benchmarks start: the conflist they get,
//! and the address ranges each user keeps to, so that runtimes running at the same time never
//! share a bridge or a subnet.
//!
//! | who | bridge | subnets |
//! |---|---|---|
//! | `berth runtime` in the agent's tests | `bta…` | `10.128.0.0/10` (10.128–10.191) |
//! | `berth-bench cri` | `benchberth0`, `benchctd0` | `10.196.0.0/24`, `10.197.0.0/24` |
//! | `scripts/testenv` | `berthtenv0` | `10.199.0.0/24` |
//! | [`crate::Containerd`] | `ctd…` | 10.200–10.231 |
//! | `berth up` in `crates/cli/tests/up.rs` | `bup…` | 10.232–10.239 |
//! | the runtime's pod tests, the CLI's crash and stream tests | `berthpt0`, `berthcr0`, `berthsx0` (shared by a test process's runtimes, removed with the last: [`BridgeLease`]) | `10.203`, `10.204`, `10.209` |

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Value, json};

/// Where Debian's `containernetworking-plugins` installs the plugins.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// A bridge network: conflist name, bridge device, IPv4 subnet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BridgeNetwork {
    pub name: String,
    pub bridge: String,
    pub subnet: String,
}

impl BridgeNetwork {
    pub fn new(name: &str, bridge: &str, subnet: &str) -> Self {
        BridgeNetwork { name: name.into(), bridge: bridge.into(), subnet: subnet.into() }
    }

    /// A bridge `<prefix><hex>` and a /24 in `10.<first_octet..first_octet+octets>.x.0`, distinct
    /// per process and per call (bridge names stay within the kernel's 15 characters for a
    /// prefix of up to 10).
    pub fn unique(prefix: &str, first_octet: u32, octets: u32) -> Self {
        static NETWORKS: AtomicU32 = AtomicU32::new(0);
        let n = std::process::id().wrapping_mul(31).wrapping_add(NETWORKS.fetch_add(1, Ordering::Relaxed));
        let bridge = format!("{prefix}{:x}", n % 0xfffff);
        let subnet = format!("10.{}.{}.0/24", first_octet + (n / 256) % octets, n % 256);
        BridgeNetwork { name: bridge.clone(), bridge, subnet }
    }

    /// Bridge (gateway, no masquerade, hairpin) with host-local IPAM whose state lives in
    /// `ipam_dir`, then portmap. No loopback plugin: berth and containerd both bring `lo` up
    /// themselves.
    pub fn conflist(&self, ipam_dir: &Path) -> Value {
        json!({
            "cniVersion": "1.0.0",
            "name": self.name,
            "plugins": [
                {
                    "type": "bridge", "bridge": self.bridge, "isGateway": true, "ipMasq": false, "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{ "subnet": self.subnet }]],
                        "routes": [{ "dst": "0.0.0.0/0" }],
                        "dataDir": ipam_dir,
                    }
                },
                { "type": "portmap", "capabilities": { "portMappings": true } }
            ]
        })
    }

    /// Writes [`Self::conflist`] as `<dir>/10-<name>.conflist`.
    pub fn write_conflist(&self, dir: &Path, ipam_dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let text = serde_json::to_vec_pretty(&self.conflist(ipam_dir)).map_err(std::io::Error::other)?;
        std::fs::write(dir.join(format!("10-{}.conflist", self.name)), text)
    }
}

/// A test process's use of a bridge that several of its runtimes share (fixed bridge names):
/// when the last lease on a bridge is dropped, the bridge is deleted, so test runs leave none
/// behind. A runtime taking a lease later gets the bridge back from the bridge plugin's next ADD.
/// Drop it after the runtime using it has stopped.
#[derive(Debug)]
pub struct BridgeLease {
    bridge: String,
}

static LEASES: std::sync::Mutex<Vec<(String, usize)>> = std::sync::Mutex::new(Vec::new());

impl BridgeLease {
    pub fn take(bridge: &str) -> BridgeLease {
        let mut leases = LEASES.lock().unwrap_or_else(|e| e.into_inner());
        match leases.iter_mut().find(|(b, _)| b == bridge) {
            Some((_, n)) => *n += 1,
            None => leases.push((bridge.to_string(), 1)),
        }
        BridgeLease { bridge: bridge.to_string() }
    }
}

impl Drop for BridgeLease {
    fn drop(&mut self) {
        // Held while deleting, so that no lease is taken between the count and the delete.
        let mut leases = LEASES.lock().unwrap_or_else(|e| e.into_inner());
        let Some(i) = leases.iter().position(|(b, _)| *b == self.bridge) else { return };
        leases[i].1 -= 1;
        if leases[i].1 == 0 {
            leases.swap_remove(i);
            if Path::new("/sys/class/net").join(&self.bridge).exists() {
                let _ = std::process::Command::new("ip").args(["link", "del", &self.bridge]).output();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_networks_differ_and_stay_in_their_range() {
        let (a, b) = (BridgeNetwork::unique("ctd", 200, 32), BridgeNetwork::unique("ctd", 200, 32));
        assert_ne!(a.bridge, b.bridge);
        assert_ne!(a.subnet, b.subnet);
        for net in [a, b] {
            assert!(net.bridge.len() <= 15, "{}", net.bridge);
            let second: u32 = net.subnet.split('.').nth(1).unwrap().parse().unwrap();
            assert!((200..232).contains(&second), "{}", net.subnet);
        }
    }

    #[test]
    fn the_conflist_keeps_ipam_state_in_the_given_dir() {
        let net = BridgeNetwork::new("n", "br", "10.1.0.0/24");
        let list = net.conflist(Path::new("/tmp/ipam"));
        assert_eq!(list["plugins"][0]["bridge"], "br");
        assert_eq!(list["plugins"][0]["ipam"]["dataDir"], "/tmp/ipam");
        assert_eq!(list["plugins"][0]["ipam"]["ranges"][0][0]["subnet"], "10.1.0.0/24");
        assert_eq!(list["plugins"][1]["type"], "portmap");
    }
}
