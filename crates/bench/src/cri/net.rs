//! Pod networks of a run: the conflists the runtimes get, the CNI plugins executed by hand for the
//! floor, and the host state (bridges, `ip_forward`) put back when the run ends.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail, ensure};
use berth_testenv::cni::BridgeNetwork;
use serde_json::{Value, json};

pub use berth_testenv::cni::CNI_BIN_DIR;
const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// One bridge network: each runtime gets its own, so their pods never share addresses.
#[derive(Debug, Clone)]
pub struct Network {
    pub name: &'static str,
    pub bridge: &'static str,
    pub subnet: &'static str,
}

impl Network {
    pub fn bridge_network(&self) -> BridgeNetwork {
        BridgeNetwork::new(self.name, self.bridge, self.subnet)
    }
}

/// testenv's bridge network (bridge, host-local IPAM in `ipam_dir`, portmap), as containerd gets it.
pub fn conflist(net: &Network, ipam_dir: &Path) -> Value {
    net.bridge_network().conflist(ipam_dir)
}

/// The plugin types a floor sample runs, IPAM included: `bridge, host-local, portmap, loopback`.
pub fn plugin_types(conflist: &Value) -> Vec<String> {
    let mut types = Vec::new();
    for plugin in conflist["plugins"].as_array().into_iter().flatten() {
        types.extend(plugin["type"].as_str().map(str::to_owned));
        types.extend(plugin["ipam"]["type"].as_str().map(str::to_owned));
    }
    types.push("loopback".into());
    types
}

/// Writes `conflist` as `<dir>/10-<name>.conflist`.
pub fn write_conflist(dir: &Path, conflist: &Value) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let name = conflist["name"].as_str().context("conflist without a name")?;
    std::fs::write(dir.join(format!("10-{name}.conflist")), serde_json::to_vec_pretty(conflist)?)?;
    Ok(())
}

/// A conflist's plugins expanded ahead of time (name and cniVersion injected, as libcni does),
/// plus `loopback` (what the runtimes' own lo network runs), attached to one netns of its own.
/// [`CniFloor::add_del`] then runs nothing but the plugin binaries: the floor of pod networking.
pub struct CniFloor {
    plugins: Vec<(PathBuf, String)>,
    netns_name: String,
    netns_path: PathBuf,
}

impl CniFloor {
    pub fn new(conflist: &Value) -> anyhow::Result<Self> {
        let name = &conflist["name"];
        let version = &conflist["cniVersion"];
        let mut plugins = Vec::new();
        let listed = conflist["plugins"].as_array().context("conflist without plugins")?;
        for plugin in listed.iter().chain(std::iter::once(&json!({ "type": "loopback" }))) {
            let mut config = plugin.clone();
            config["name"] = name.clone();
            config["cniVersion"] = version.clone();
            let kind = config["type"].as_str().context("plugin without a type")?;
            plugins.push((Path::new(CNI_BIN_DIR).join(kind), config.to_string()));
        }
        let netns_name = format!("berth-bench-floor-{}", std::process::id());
        run("ip", &["netns", "add", &netns_name])?;
        let netns_path = Path::new("/run/netns").join(&netns_name);
        Ok(Self { plugins, netns_name, netns_path })
    }

    /// ADD through every plugin in order, each given the previous result, then DEL in reverse.
    pub fn add_del(&self, container_id: &str) -> anyhow::Result<()> {
        self.add(container_id)?;
        self.del(container_id)
    }

    /// ADD through every plugin in order, each given the previous result.
    pub fn add(&self, container_id: &str) -> anyhow::Result<()> {
        self.add_in(&self.netns_path, container_id)
    }

    /// DEL through every plugin in reverse order.
    pub fn del(&self, container_id: &str) -> anyhow::Result<()> {
        self.del_in(&self.netns_path, container_id)
    }

    /// [`CniFloor::add`] into the network namespace at `netns` (one of [`Netns`]).
    pub fn add_in(&self, netns: &Path, container_id: &str) -> anyhow::Result<()> {
        let mut previous: Option<String> = None;
        for (bin, config) in &self.plugins {
            let input = match &previous {
                Some(result) => with_prev_result(config, result),
                None => config.clone(),
            };
            previous = Some(self.exec(bin, "ADD", netns, container_id, &input)?);
        }
        Ok(())
    }

    /// [`CniFloor::del`] from the network namespace at `netns`.
    pub fn del_in(&self, netns: &Path, container_id: &str) -> anyhow::Result<()> {
        for (bin, config) in self.plugins.iter().rev() {
            self.exec(bin, "DEL", netns, container_id, config)?;
        }
        Ok(())
    }

    fn exec(&self, bin: &Path, command: &str, netns: &Path, container_id: &str, input: &str) -> anyhow::Result<String> {
        let ifname = if bin.ends_with("loopback") { "lo" } else { "eth0" };
        let mut child = Command::new(bin)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", container_id)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", ifname)
            .env("CNI_PATH", CNI_BIN_DIR)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("running {}", bin.display()))?;
        child.stdin.take().context("plugin stdin")?.write_all(input.as_bytes())?;
        let out = child.wait_with_output()?;
        ensure!(
            out.status.success(),
            "CNI {command} of {} failed: {}{}",
            bin.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?)
    }
}

/// `config` (a serialized JSON object) with `"prevResult": result` added, spliced as text so the
/// floor spends no time parsing JSON.
fn with_prev_result(config: &str, result: &str) -> String {
    format!("{},\"prevResult\":{}}}", &config[..config.len() - 1], result.trim())
}

impl Drop for CniFloor {
    fn drop(&mut self) {
        let _ = run("ip", &["netns", "del", &self.netns_name]);
    }
}

/// A named network namespace of the bench (`ip netns add`), deleted on drop.
pub struct Netns {
    name: String,
    pub path: PathBuf,
}

impl Netns {
    pub fn new(tag: &str) -> anyhow::Result<Self> {
        let name = format!("berth-bench-{tag}-{}", std::process::id());
        run("ip", &["netns", "add", &name])?;
        Ok(Self { path: Path::new("/run/netns").join(&name), name })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run("ip", &["netns", "del", &self.name]);
    }
}

/// What the run changes on the host outside its temp dirs, taken before it starts: bridges the
/// bridge plugin creates and `ip_forward`, which it turns on for gateways.
pub struct HostState {
    ip_forward: Option<String>,
    new_bridges: Vec<&'static str>,
}

impl HostState {
    /// Refuses bridges that already exist: another run (or a leftover) would share addresses.
    pub fn take(networks: &[&Network]) -> anyhow::Result<Self> {
        for net in networks {
            if Path::new("/sys/class/net").join(net.bridge).exists() {
                bail!("bridge {} already exists (a leftover of an earlier run? `ip link del {0}`)", net.bridge);
            }
        }
        Ok(Self {
            ip_forward: std::fs::read_to_string(IP_FORWARD).ok(),
            new_bridges: networks.iter().map(|n| n.bridge).collect(),
        })
    }
}

impl Drop for HostState {
    fn drop(&mut self) {
        for bridge in &self.new_bridges {
            if Path::new("/sys/class/net").join(bridge).exists() {
                let _ = run("ip", &["link", "del", bridge]);
            }
        }
        if let Some(value) = &self.ip_forward {
            let _ = std::fs::write(IP_FORWARD, value);
        }
    }
}

/// Runs a setup command (not timed), failing with its stderr.
pub fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(program).args(args).output().with_context(|| format!("running {program}"))?;
    ensure!(
        out.status.success(),
        "{program} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_previous_result_is_spliced_into_the_next_plugins_config() {
        let spliced = with_prev_result(r#"{"type":"portmap"}"#, "{\"ips\":[]}\n");
        let v: Value = serde_json::from_str(&spliced).unwrap();
        assert_eq!(v, json!({"type": "portmap", "prevResult": {"ips": []}}));
    }

    #[test]
    fn the_floor_runs_every_plugin_of_the_conflist_plus_loopback() {
        let net = Network { name: "n", bridge: "br", subnet: "10.1.0.0/24" };
        let list = conflist(&net, Path::new("/tmp/ipam"));
        assert_eq!(plugin_types(&list), ["bridge", "host-local", "portmap", "loopback"]);
        assert_eq!(list["plugins"][0]["ipam"]["dataDir"], "/tmp/ipam");
    }
}
