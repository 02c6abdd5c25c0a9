//! Integration tests against the kernel and Debian's CNI plugins (`/usr/lib/cni`); they need root
//! and iptables, and fail without them.
//!
//! Each test has its own bridge (`berthtest<N>`), subnet (`10.77.<N>.0/24`), network name, host
//! port, namespace directory, IPAM dir and cache, and a guard that removes all of it — plus
//! portmap's shared iptables chains when the test created them, and `net.ipv4.ip_forward` as it
//! was — even when the test fails. The tests still run one at a time, because those chains and
//! the sysctl are shared.

use std::io::Read as _;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use berth_cni::{Attachment, Cni, CniError, DefaultNetwork, KernelNetns, NetnsError, NetnsOps, PortMapping};

const PLUGIN_DIR: &str = "/usr/lib/cni";
const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
static SERIAL: Mutex<()> = Mutex::new(());

/// `(success, stdout + stderr)` of a command.
fn sh(program: &str, args: &[&str]) -> (bool, String) {
    let output = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("running {program}: {e}"));
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

/// A command inside the network namespace at `netns`.
fn in_netns(netns: &Path, args: &[&str]) -> (bool, String) {
    let net = format!("--net={}", netns.display());
    sh("nsenter", &[&[net.as_str(), "--"], args].concat())
}

fn nat_rules() -> String {
    sh("iptables", &["-t", "nat", "-S"]).1
}

/// Checks the environment can run these tests; fails the test (never skips it) when it cannot,
/// so a missing package shows up in CI.
fn can_run() -> bool {
    let root = nix::unistd::geteuid().is_root();
    let plugins =
        ["bridge", "host-local", "portmap", "loopback"].iter().all(|p| Path::new(PLUGIN_DIR).join(p).exists());
    let tools = sh("sh", &["-c", "command -v iptables && command -v nsenter && command -v busybox"]).0;
    assert!(
        root && plugins && tools,
        "needs root, {PLUGIN_DIR}/{{bridge,host-local,portmap,loopback}}, iptables, nsenter, busybox (scripts/install-deps.sh)"
    );
    true
}

/// One test's network and everything the guard removes.
struct TestNet {
    index: u8,
    bridge: String,
    network: String,
    dir: tempfile::TempDir,
    netns_dir: tempfile::TempDir,
    netns: KernelNetns,
    cni: Cni,
    /// Whether portmap's shared chains were there before the test.
    hostport_chains_existed: bool,
    /// `net.ipv4.ip_forward` before the test (the bridge plugin's `isGateway` turns it on).
    ip_forward: String,
    /// Containers (= namespace names) to detach and delete.
    containers: Vec<String>,
    children: Vec<Child>,
}

impl TestNet {
    /// The default conflist with this test's bridge, subnet and IPAM dir; more plugins from
    /// `extra` are appended, and `extra_bin` is searched before the system plugin dir.
    fn new(index: u8, extra: &[serde_json::Value], extra_bin: Option<&Path>) -> Self {
        let bridge = format!("berthtest{index}");
        // Leftovers of an earlier run that was killed.
        let _ = sh("ip", &["link", "del", &bridge]);
        let dir = tempfile::tempdir().unwrap();
        let netns_dir = tempfile::Builder::new().prefix("berth-cni-test-netns").tempdir_in("/run").unwrap();
        let network = format!("berthtest{index}-{}", std::process::id());
        let default = DefaultNetwork {
            name: network.clone(),
            bridge: bridge.clone(),
            subnet: format!("10.77.{index}.0/24"),
            ipam_data_dir: dir.path().join("ipam"),
            ip_masq: true,
        };
        let mut conflist = default.conflist();
        conflist["plugins"].as_array_mut().unwrap().extend(extra.iter().cloned());
        let conf_dir = dir.path().join("net.d");
        std::fs::create_dir_all(&conf_dir).unwrap();
        std::fs::write(conf_dir.join("10-test.conflist"), conflist.to_string()).unwrap();
        let mut bin_dirs: Vec<PathBuf> = extra_bin.map(Path::to_owned).into_iter().collect();
        bin_dirs.push(PLUGIN_DIR.into());
        let cni = Cni::new(conf_dir, bin_dirs).with_cache_dir(dir.path().join("cache"));
        let hostport_chains_existed = sh("iptables", &["-t", "nat", "-S", "CNI-HOSTPORT-DNAT"]).0;
        let netns = KernelNetns::new(netns_dir.path().join("netns"));
        let ip_forward = std::fs::read_to_string(IP_FORWARD).unwrap();
        Self {
            index,
            bridge,
            network,
            dir,
            netns_dir,
            netns,
            cni,
            hostport_chains_existed,
            ip_forward,
            containers: Vec::new(),
            children: Vec::new(),
        }
    }

    /// A fresh namespace for a container of this test, and its attachment with pod args.
    fn container(&mut self, suffix: &str) -> Attachment {
        let id = format!("berthtest{}-{}-{suffix}", self.index, std::process::id());
        self.containers.push(id.clone());
        let path = self.netns.create(&id).unwrap();
        Attachment::new(id.as_str(), path).with_pod("default", &format!("pod-{suffix}"), "uid-1")
    }

    fn gateway(&self) -> IpAddr {
        format!("10.77.{}.1", self.index).parse().unwrap()
    }

    /// The addresses host-local has handed out and not released.
    fn ipam_allocations(&self) -> Vec<String> {
        let dir = self.dir.path().join("ipam").join(&self.network);
        let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
        entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.parse::<IpAddr>().is_ok())
            .collect()
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for id in &self.containers {
            let _ = self.cni.del(&Attachment::new(id.as_str(), self.netns.path(id)));
            let _ = self.netns.delete(id);
        }
        // The namespace dir is a (shared) bind mount of itself.
        let _ = nix::mount::umount2(self.netns.dir(), nix::mount::MntFlags::MNT_DETACH);
        let _ = sh("ip", &["link", "del", &self.bridge]);
        if !self.hostport_chains_existed {
            remove_hostport_chains_if_unused();
        }
        let _ = std::fs::write(IP_FORWARD, &self.ip_forward);
        let _ = &self.netns_dir;
    }
}

/// Removes portmap's shared chains (and the jumps to them) when no container's rules use them.
fn remove_hostport_chains_if_unused() {
    let rules = nat_rules();
    if rules.lines().any(|l| l.starts_with("-A CNI-HOSTPORT-DNAT")) {
        return;
    }
    for rule in rules.lines().filter(|l| l.starts_with("-A ") && l.contains("-j CNI-HOSTPORT-")) {
        // `iptables -S` prints rules in a form the shell can parse back (quoted comments).
        let _ = sh("sh", &["-c", &format!("iptables -t nat -D {}", &rule[3..])]);
    }
    let chains: Vec<String> = rules
        .lines()
        .filter_map(|l| l.strip_prefix("-N "))
        .filter(|c| c.starts_with("CNI-HOSTPORT-"))
        .map(str::to_owned)
        .collect();
    for chain in &chains {
        let _ = sh("iptables", &["-t", "nat", "-F", chain]);
    }
    for chain in &chains {
        let _ = sh("iptables", &["-t", "nat", "-X", chain]);
    }
}

/// Reads what a listener sends after connecting to `addr`, retrying while it starts.
fn read_from(addr: SocketAddr) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let attempt = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).and_then(|mut stream| {
            stream.set_read_timeout(Some(Duration::from_secs(3)))?;
            let mut text = String::new();
            stream.read_to_string(&mut text)?;
            Ok(text)
        });
        match attempt {
            Ok(text) if !text.is_empty() => return text,
            _ if Instant::now() > deadline => panic!("nothing from {addr}: {attempt:?}"),
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

#[test]
fn a_namespace_is_created_once_and_deleted_idempotently() {
    if !can_run() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::Builder::new().prefix("berth-cni-test-netns").tempdir_in("/run").unwrap();
    let netns = KernelNetns::new(dir.path().join("netns"));
    let name = format!("berthtest-ns-{}", std::process::id());
    let path = netns.create(&name).unwrap();
    let guard = scopeguard(|| {
        let _ = netns.delete(&name);
        let _ = nix::mount::umount2(netns.dir(), nix::mount::MntFlags::MNT_DETACH);
    });
    assert!(netns.exists(&name));
    assert!(matches!(netns.create(&name), Err(NetnsError::AlreadyExists { .. })));
    // The directory is a shared mount point, bound onto itself once, as `ip netns add` leaves it.
    let dir_arg = netns.dir().to_string_lossy().into_owned();
    let (_, propagation) = sh("findmnt", &["-n", "-o", "PROPAGATION", "--mountpoint", &dir_arg]);
    assert_eq!(propagation.trim(), "shared", "{propagation}");
    let second = format!("{name}-2");
    KernelNetns::new(netns.dir()).create(&second).unwrap();
    KernelNetns::new(netns.dir()).delete(&second).unwrap();
    let (_, mounts) = sh("findmnt", &["-n", "-o", "TARGET", "--mountpoint", &dir_arg]);
    assert_eq!(mounts.lines().count(), 1, "{mounts}");
    // A new namespace has only a loopback interface, and it is down.
    let (ok, links) = in_netns(&path, &["ip", "-o", "link"]);
    assert!(ok, "{links}");
    assert_eq!(links.lines().count(), 1, "{links}");
    assert!(links.contains("lo:") && !links.contains("LOOPBACK,UP"), "{links}");
    // Different from the host's namespace.
    let host = std::fs::read_link("/proc/self/ns/net").unwrap();
    let (_, inside) = in_netns(&path, &["readlink", "/proc/self/ns/net"]);
    assert_ne!(inside.trim(), host.to_string_lossy());

    netns.delete(&name).unwrap();
    assert!(!netns.exists(&name));
    assert!(!path.exists());
    netns.delete(&name).unwrap();
    drop(guard);
}

#[test]
fn add_wires_eth0_lo_a_default_route_and_a_port_mapping_and_del_removes_them_once_and_again() {
    if !can_run() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut net = TestNet::new(0, &[], None);
    let host_port = 38470;
    let attachment = net.container("a").with_port_mappings(vec![PortMapping::tcp(host_port, 8080)]);
    let id = attachment.container_id.clone();
    let netns = attachment.netns_path.clone();
    assert!(net.cni.status().ready, "{:?}", net.cni.status());

    let result = net.cni.add(&attachment).unwrap();
    let pod_ip = result.pod_ip().unwrap();
    assert!(pod_ip.to_string().starts_with("10.77.0."), "{pod_ip}");
    assert_eq!(result.ips[0].prefix_len, 24);
    assert_eq!(result.ips[0].gateway, Some(net.gateway()));
    assert!(result.interfaces.iter().any(|i| i.name == "eth0" && i.sandbox.is_some()), "{result:?}");
    assert_eq!(net.ipam_allocations(), [pod_ip.to_string()]);

    let (_, addr) = in_netns(&netns, &["ip", "-4", "-o", "addr", "show", "eth0"]);
    assert!(addr.contains(&format!("{pod_ip}/24")), "{addr}");
    let (_, lo) = in_netns(&netns, &["ip", "-o", "link", "show", "lo"]);
    assert!(lo.contains("LOOPBACK,UP"), "{lo}");
    let (_, routes) = in_netns(&netns, &["ip", "route", "show", "default"]);
    assert!(routes.contains(&format!("default via {}", net.gateway())), "{routes}");
    let (ok, ping) = in_netns(&netns, &["busybox", "ping", "-c1", "-W1", &net.gateway().to_string()]);
    assert!(ok, "ping of the gateway from the pod: {ping}");

    // TCP from the host through the port mapping to a listener in the namespace.
    let net_arg = format!("--net={}", netns.display());
    let listener = Command::new("nsenter")
        .args([net_arg.as_str(), "--", "busybox", "nc", "-l", "-p", "8080", "-e", "echo", "hello-from-netns"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    net.children.push(listener);
    let got = read_from(SocketAddr::new(net.gateway(), host_port));
    assert_eq!(got.trim(), "hello-from-netns");
    assert!(nat_rules().contains(&id), "portmap and masquerade rules name the container");

    net.cni.check(&attachment).unwrap();

    net.cni.del(&attachment).unwrap();
    let (has_eth0, _) = in_netns(&netns, &["ip", "link", "show", "eth0"]);
    assert!(!has_eth0, "eth0 is gone after DEL");
    let rules = nat_rules();
    assert!(!rules.contains(&id), "no NAT rule for {id} after DEL:\n{rules}");
    assert!(net.ipam_allocations().is_empty(), "the address is released");
    assert_eq!(net.cni.cached_result(&id).unwrap(), None);

    net.cni.del(&attachment).unwrap();
    net.netns.delete(&id).unwrap();
    net.cni.del(&attachment).unwrap();
    assert!(!nat_rules().contains(&id));
}

#[test]
fn an_add_that_fails_midway_leaves_no_interface_address_rule_or_namespace_behind() {
    if !can_run() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let bin = tempfile::tempdir().unwrap();
    let failing = bin.path().join("berth-fail");
    let script = r#"#!/bin/sh
cat >/dev/null
if [ "$CNI_COMMAND" = ADD ]; then
  echo '{"cniVersion":"1.0.0","code":11,"msg":"refusing on purpose"}'
  echo 'some trace' >&2
  exit 1
fi
"#;
    std::fs::write(&failing, script).unwrap();
    std::fs::set_permissions(&failing, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut net = TestNet::new(1, &[serde_json::json!({"type": "berth-fail"})], Some(bin.path()));
    let id = format!("berthtest1-{}-fail", std::process::id());
    net.containers.push(id.clone());
    let attachment = Attachment::new(id.as_str(), "").with_port_mappings(vec![PortMapping::tcp(38471, 8080)]);

    let err = net.cni.setup_sandbox(&net.netns, attachment).unwrap_err();
    match &err {
        CniError::PluginFailed { plugin, code, msg, stderr, .. } => {
            assert_eq!((plugin.as_str(), *code), ("berth-fail", Some(11)));
            assert_eq!((msg.as_str(), stderr.as_str()), ("refusing on purpose", "some trace"));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(!net.netns.exists(&id), "the namespace is deleted again");
    assert!(!nat_rules().contains(&id), "portmap's and the bridge's rules are removed");
    assert!(net.ipam_allocations().is_empty(), "the address is released");
    assert_eq!(net.cni.cached_result(&id).unwrap(), None);
    let (_, links) = sh("ip", &["-o", "link", "show", "master", &net.bridge]);
    assert!(links.trim().is_empty(), "no veth left on the bridge: {links}");
}

#[test]
fn an_add_naming_a_missing_plugin_changes_nothing() {
    if !can_run() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut net = TestNet::new(2, &[serde_json::json!({"type": "berth-no-such-plugin"})], None);
    let status = net.cni.status();
    assert!(!status.ready && status.message.contains("berth-no-such-plugin"), "{status:?}");
    let attachment = net.container("missing");
    let err = net.cni.add(&attachment).unwrap_err();
    assert!(matches!(&err, CniError::PluginNotFound { plugin, .. } if plugin == "berth-no-such-plugin"), "{err:?}");
    let (bridge_exists, _) = sh("ip", &["link", "show", &net.bridge]);
    assert!(!bridge_exists, "the bridge plugin never ran");
    let (_, links) = in_netns(&attachment.netns_path, &["ip", "-o", "link"]);
    assert_eq!(links.lines().count(), 1, "only lo, untouched: {links}");
    assert!(!links.contains("LOOPBACK,UP"), "{links}");
}

/// Runs `f` when dropped.
fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}
