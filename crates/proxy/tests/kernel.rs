//! The proxy's rules in a real kernel: a throwaway network namespace plays the node, a second
//! one plays the pods behind a veth, and TCP connections go through the rules as applied by
//! `nft` (the whole table) and by netlink batches (the changes), as the proxy applies them.
//! Needs root and nftables.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use berth_proxy::command::Command as Step;
use berth_proxy::conntrack;
use berth_proxy::model::{Endpoint, Protocol, ServiceKey, ServicePort};
use berth_proxy::netlink::Netlink;
use berth_proxy::proxier::apply_changes;
use berth_proxy::rules::{NodeNetwork, ServiceRules, service_rules};
use berth_proxy::sync::Applied;
use berth_proxy::table::Table;

const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 7, 1);
const POD_A: Ipv4Addr = Ipv4Addr::new(10, 244, 7, 2);
const POD_B: Ipv4Addr = Ipv4Addr::new(10, 244, 7, 3);
const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 7, 10);

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip runs");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Two namespaces: `node` (NODE_IP) and `pods` (POD_A and POD_B), joined by a veth; removed on drop.
struct Host {
    node: String,
    pods: String,
    /// A wrapper that runs nft inside the node namespace.
    nft: PathBuf,
    /// The same for conntrack.
    conntrack: PathBuf,
    /// A netlink socket in the node namespace.
    netlink: std::sync::Mutex<Netlink>,
    _dir: tempfile::TempDir,
}

impl Host {
    fn new(tag: &str) -> Host {
        let id = std::process::id();
        let (node, pods) = (format!("bpx{tag}n{id}"), format!("bpx{tag}p{id}"));
        ip(&["netns", "add", &node]);
        ip(&["netns", "add", &pods]);
        let (veth_node, veth_pods) = (format!("bpx{tag}{id}a"), format!("bpx{tag}{id}b"));
        ip(&["link", "add", &veth_node, "netns", &node, "type", "veth", "peer", "name", &veth_pods, "netns", &pods]);
        let in_node = |args: &[&str]| ip(&[&["-n", node.as_str()], args].concat());
        let in_pods = |args: &[&str]| ip(&[&["-n", pods.as_str()], args].concat());
        in_node(&["addr", "add", &format!("{NODE_IP}/24"), "dev", &veth_node]);
        in_node(&["link", "set", &veth_node, "up"]);
        in_node(&["link", "set", "lo", "up"]);
        in_node(&["route", "add", "10.96.0.0/12", "dev", &veth_node]);
        in_pods(&["addr", "add", &format!("{POD_A}/24"), "dev", &veth_pods]);
        in_pods(&["addr", "add", &format!("{POD_B}/24"), "dev", &veth_pods]);
        in_pods(&["link", "set", &veth_pods, "up"]);
        in_pods(&["link", "set", "lo", "up"]);
        in_pods(&["route", "add", "default", "via", &NODE_IP.to_string()]);
        let forward = Command::new("ip")
            .args(["netns", "exec", &node, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"])
            .status()
            .unwrap();
        assert!(forward.success());
        let dir = tempfile::tempdir().unwrap();
        let wrapper = |program: &str| {
            let path = dir.path().join(program);
            std::fs::write(&path, format!("#!/bin/sh\nexec ip netns exec {node} {program} \"$@\"\n")).unwrap();
            std::process::Command::new("chmod").arg("+x").arg(&path).status().unwrap();
            path
        };
        let (nft, conntrack) = (wrapper("nft"), wrapper("conntrack"));
        let netlink = Host::within(&node, Netlink::open).join().unwrap().expect("a netlink socket opens");
        Host { node, pods, nft, conntrack, netlink: netlink.into(), _dir: dir }
    }

    /// Runs `f` on a thread inside namespace `name`.
    fn within<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> std::thread::JoinHandle<T> {
        let file = std::fs::File::open(format!("/run/netns/{name}")).unwrap();
        std::thread::spawn(move || {
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            f()
        })
    }

    /// A server on each pod address that answers every connection with its own address.
    fn serve_pods(&self) {
        for addr in [POD_A, POD_B] {
            let listener = Host::within(&self.pods, move || TcpListener::bind((addr, 8080)).unwrap()).join().unwrap();
            std::thread::spawn(move || {
                for mut conn in listener.incoming().flatten() {
                    let _ = conn.write_all(addr.to_string().as_bytes());
                }
            });
        }
    }

    /// A UDP server on each pod address that answers every datagram with its own address.
    fn serve_pods_udp(&self) {
        for addr in [POD_A, POD_B] {
            let socket = Host::within(&self.pods, move || UdpSocket::bind((addr, 5353)).unwrap()).join().unwrap();
            std::thread::spawn(move || {
                let mut buf = [0u8; 64];
                while let Ok((_, from)) = socket.recv_from(&mut buf) {
                    let _ = socket.send_to(addr.to_string().as_bytes(), from);
                }
            });
        }
    }

    /// Sends one datagram from the node namespace's port `from_port` (the same flow each time)
    /// and reads the answering pod's address.
    fn ask_udp(&self, to: SocketAddr, from_port: u16) -> std::io::Result<String> {
        Host::within(&self.node, move || {
            let socket = UdpSocket::bind((NODE_IP, from_port))?;
            socket.set_read_timeout(Some(Duration::from_secs(3)))?;
            socket.send_to(b"who", to)?;
            let mut buf = [0u8; 64];
            let n = socket.recv(&mut buf)?;
            Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
        })
        .join()
        .unwrap()
    }

    /// Connects from the node namespace (or the pods one) and reads the answering pod's address.
    fn connect_from(&self, ns: &str, to: SocketAddr) -> std::io::Result<String> {
        Host::within(ns, move || {
            let mut conn = TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
            conn.set_read_timeout(Some(Duration::from_secs(3)))?;
            let mut answer = String::new();
            conn.read_to_string(&mut answer)?;
            Ok(answer)
        })
        .join()
        .unwrap()
    }

    fn connect(&self, to: SocketAddr) -> std::io::Result<String> {
        self.connect_from(&self.node, to)
    }

    /// Applies `commands` to `table` in one netlink batch.
    fn batch(&self, table: &Table, commands: &[Step]) -> Result<(), berth_proxy::ProxyError> {
        self.netlink.lock().unwrap().apply(&table.name, commands)
    }

    fn ruleset(&self) -> String {
        let out = Command::new(&self.nft).args(["list", "ruleset"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        for ns in [&self.node, &self.pods] {
            let _ = Command::new("ip").args(["netns", "delete", ns]).status();
        }
    }
}

fn port(endpoints: &[Ipv4Addr]) -> ServicePort {
    ServicePort {
        service: ServiceKey::new("default", "web"),
        name: "http".into(),
        protocol: Protocol::Tcp,
        port: 80,
        cluster_ips: vec![CLUSTER_IP],
        external_ips: vec![],
        node_port: Some(30080),
        affinity_timeout: None,
        external_local: false,
        internal_local: false,
        endpoints: endpoints.iter().map(|ip| Endpoint { ip: *ip, port: 8080, local: true }).collect(),
    }
}

const NET: NodeNetwork = NodeNetwork {
    pod_cidr: Some((Ipv4Addr::new(10, 244, 7, 0), 24)),
    cluster_cidr: Some((Ipv4Addr::new(10, 244, 0, 0), 16)),
};

fn rules(p: ServicePort) -> ServiceRules {
    service_rules(&[p], NET)
}

/// Applies `rules` for the one Service, incrementally on top of `applied`, as the proxy does: in
/// one netlink batch.
async fn change(host: &Host, table: &Table, applied: &mut Applied, rules: Option<ServiceRules>) {
    let changes = vec![(ServiceKey::new("default", "web"), rules)];
    host.batch(table, &applied.changes(&changes)).expect("the kernel accepts the change");
    applied.commit(changes);
}

fn answers(host: &Host, to: SocketAddr, tries: usize) -> std::collections::BTreeSet<String> {
    (0..tries).map(|_| host.connect(to).expect("the Service answers")).collect()
}

#[tokio::test]
async fn cluster_ips_and_node_ports_reach_ready_endpoints_and_a_port_without_endpoints_refuses() {
    let host = Host::new("a");
    host.serve_pods();
    let table = Table::new("berth-test");
    let service = SocketAddr::from((CLUSTER_IP, 80));
    let node_port = SocketAddr::from((NODE_IP, 30080));

    let all = [(ServiceKey::new("default", "web"), rules(port(&[POD_A])))].into_iter().collect();
    let (mut cmds, mut applied) = Applied::rebuild(&table, all);
    cmds.extend(table.pod_egress(NET));
    berth_proxy::apply(&host.nft, cmds).await.expect("nft accepts the whole table");
    assert!(
        host.ruleset().contains("ip saddr 10.244.7.0/24 ip daddr != 10.244.0.0/16 masquerade"),
        "pods' traffic leaving the cluster is masqueraded:\n{}",
        host.ruleset()
    );
    assert_eq!(host.connect(service).unwrap(), POD_A.to_string(), "ClusterIP → the one endpoint");
    assert_eq!(host.connect(node_port).unwrap(), POD_A.to_string(), "NodePort → the one endpoint");

    change(&host, &table, &mut applied, Some(rules(port(&[POD_A, POD_B])))).await;
    let seen = answers(&host, service, 40);
    assert_eq!(seen, [POD_A.to_string(), POD_B.to_string()].into(), "both endpoints take connections");

    change(&host, &table, &mut applied, Some(rules(port(&[POD_B])))).await;
    assert_eq!(answers(&host, service, 10), [POD_B.to_string()].into(), "a removed endpoint leaves the rotation");
    assert!(!host.ruleset().contains(&format!("{POD_A}/8080")), "its chain is gone:\n{}", host.ruleset());

    change(&host, &table, &mut applied, Some(rules(port(&[])))).await;
    let refused = host.connect(service).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused, "{refused}");
    let refused = host.connect(node_port).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused, "{refused}");

    change(&host, &table, &mut applied, Some(rules(port(&[POD_A])))).await;
    assert_eq!(host.connect(service).unwrap(), POD_A.to_string(), "endpoints back: served again");

    change(&host, &table, &mut applied, None).await;
    assert!(!host.ruleset().contains("default/web"), "a deleted Service leaves nothing:\n{}", host.ruleset());

    berth_proxy::remove_table(&host.nft, "berth-test").await.unwrap();
    assert!(!host.ruleset().contains("berth-test"));
    berth_proxy::remove_table(&host.nft, "berth-test").await.expect("removing an absent table is fine");
}

#[tokio::test]
async fn client_ip_affinity_sticks_and_a_pod_reaches_itself_through_its_service() {
    let host = Host::new("b");
    host.serve_pods();
    let table = Table::new("berth-test");
    let service = SocketAddr::from((CLUSTER_IP, 80));
    let mut sticky = port(&[POD_A, POD_B]);
    sticky.affinity_timeout = Some(60);
    let all = [(ServiceKey::new("default", "web"), rules(sticky))].into_iter().collect();
    let (cmds, mut applied) = Applied::rebuild(&table, all);
    berth_proxy::apply(&host.nft, cmds).await.unwrap();
    let first = host.connect(service).unwrap();
    assert_eq!(answers(&host, service, 20), [first].into(), "one client keeps its endpoint");

    // The pod at POD_A connects to its own Service and lands on itself: the node must
    // masquerade it, or the reply would never go back through the node's conntrack.
    change(&host, &table, &mut applied, Some(rules(port(&[POD_A])))).await;
    let answer = host.connect_from(&host.pods, service).expect("hairpin works");
    assert_eq!(answer, POD_A.to_string());
}

#[tokio::test]
async fn a_udp_client_moves_off_an_endpoint_that_left_once_its_stale_flows_are_cleared() {
    let host = Host::new("u");
    host.serve_pods_udp();
    let table = Table::new("berth-test");
    let service = SocketAddr::from((CLUSTER_IP, 53));
    let dns = |endpoints: &[Ipv4Addr]| {
        let mut p = port(endpoints);
        (p.protocol, p.port, p.node_port) = (Protocol::Udp, 53, None);
        p.endpoints.iter_mut().for_each(|e| e.port = 5353);
        rules(p)
    };
    let all = [(ServiceKey::new("default", "web"), dns(&[POD_A]))].into_iter().collect();
    let (cmds, mut applied) = Applied::rebuild(&table, all);
    berth_proxy::apply(&host.nft, cmds).await.unwrap();
    assert_eq!(host.ask_udp(service, 40053).unwrap(), POD_A.to_string());

    let (old, new) = (dns(&[POD_A]), dns(&[POD_B]));
    change(&host, &table, &mut applied, Some(new.clone())).await;
    assert_eq!(
        host.ask_udp(service, 40053).unwrap(),
        POD_A.to_string(),
        "the rules alone leave the flow on the endpoint that left"
    );
    let stale = conntrack::stale(Some(&old), Some(&new));
    assert_eq!(stale.len(), 1, "{stale:?}");
    conntrack::clear(&host.conntrack, &stale).await;
    assert_eq!(host.ask_udp(service, 40053).unwrap(), POD_B.to_string(), "the same flow goes to the endpoint left");
}

/// The table's listing with its name and the handles left out, to compare two tables.
fn listing(host: &Host, table: &Table) -> (String, serde_json::Value) {
    let run = |args: &[&str]| {
        let out = Command::new(&host.nft).args(args).output().unwrap();
        assert!(out.status.success(), "nft {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let text = run(&["list", "table", "ip", &table.name]).replace(&table.name, "TABLE");
    let mut json: serde_json::Value = serde_json::from_str(&run(&["-j", "list", "table", "ip", &table.name])).unwrap();
    fn scrub(v: &mut serde_json::Value, name: &str) {
        match v {
            serde_json::Value::Object(map) => {
                map.remove("handle");
                map.values_mut().for_each(|v| scrub(v, name));
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(|v| scrub(v, name)),
            serde_json::Value::String(s) if s == name => *s = "TABLE".into(),
            _ => {}
        }
    }
    scrub(&mut json, &table.name);
    // The first entry is nft's own version.
    if let Some(items) = json.get_mut("nftables").and_then(|v| v.as_array_mut()) {
        items.retain(|i| i.get("metainfo").is_none());
    }
    (text, json)
}

/// Every kind of rule the Service chains hold: affinity, node ports, external IPs, both traffic
/// policies, a port without endpoints.
fn every_kind(endpoints: &[Ipv4Addr]) -> Vec<(ServiceKey, Option<ServiceRules>)> {
    let mut sticky = port(endpoints);
    sticky.service = ServiceKey::new("default", "sticky");
    sticky.cluster_ips = vec![Ipv4Addr::new(10, 96, 7, 11)];
    sticky.affinity_timeout = Some(10800);
    sticky.node_port = Some(30081);
    let mut local = port(endpoints);
    local.service = ServiceKey::new("default", "local");
    local.cluster_ips = vec![Ipv4Addr::new(10, 96, 7, 12)];
    local.external_ips = vec![Ipv4Addr::new(192, 0, 2, 7)];
    local.node_port = Some(30082);
    local.external_local = true;
    if let Some(first) = local.endpoints.first_mut() {
        first.local = false;
    }
    let mut udp = port(endpoints);
    udp.service = ServiceKey::new("default", "dns");
    udp.protocol = Protocol::Udp;
    udp.port = 53;
    udp.cluster_ips = vec![Ipv4Addr::new(10, 96, 7, 13)];
    let mut empty = port(&[]);
    empty.service = ServiceKey::new("default", "empty");
    empty.cluster_ips = vec![Ipv4Addr::new(10, 96, 7, 14)];
    empty.node_port = Some(30084);
    let no_pod_cidr = NodeNetwork { pod_cidr: None, ..NET };
    let mut plain = port(endpoints);
    plain.service = ServiceKey::new("default", "plain");
    plain.cluster_ips = vec![Ipv4Addr::new(10, 96, 7, 15)];
    plain.node_port = None;
    [sticky, local, udp, empty]
        .into_iter()
        .map(|p| (p.service.clone(), Some(rules(p))))
        .chain([(plain.service.clone(), Some(service_rules(&[plain], no_pod_cidr)))])
        .collect()
}

#[tokio::test]
async fn a_change_through_netlink_lists_exactly_as_the_same_change_through_nft() {
    let host = Host::new("c");
    let (by_json, by_netlink) = (Table::new("berth-json"), Table::new("berth-netlink"));
    let mut states = Vec::new();
    for table in [&by_json, &by_netlink] {
        let (mut cmds, applied) = Applied::rebuild(table, Default::default());
        cmds.extend(table.pod_egress(NET));
        berth_proxy::apply(&host.nft, cmds).await.expect("nft accepts the empty table");
        states.push(applied);
    }
    // Services appear, their endpoints change, then they go.
    let steps = [every_kind(&[POD_A]), every_kind(&[POD_A, POD_B]), every_kind(&[POD_B]), every_kind(&[])];
    let gone: Vec<_> = steps[0].iter().map(|(k, _)| (k.clone(), None)).collect();
    for changes in steps.into_iter().chain([gone]) {
        let json: Vec<_> = states[0].changes(&changes).iter().map(|c| c.json(&by_json)).collect();
        berth_proxy::apply(&host.nft, json).await.expect("nft accepts the change");
        host.batch(&by_netlink, &states[1].changes(&changes)).expect("the kernel accepts the batch");
        let (json_text, json_listing) = listing(&host, &by_json);
        let (netlink_text, netlink_listing) = listing(&host, &by_netlink);
        assert_eq!(netlink_text, json_text);
        assert_eq!(netlink_listing, json_listing);
        for state in &mut states {
            state.commit(changes.clone());
        }
    }
    let (text, _) = listing(&host, &by_netlink);
    assert!(!text.contains("default/"), "every Service is gone:\n{text}");
    assert!(
        states[1].is_empty() && text.contains("no-endpoint-services") && text.contains("reject"),
        "the fixed part stays:\n{text}"
    );
}

#[tokio::test]
async fn every_rule_kind_reaches_the_kernel_in_one_netlink_batch() {
    let host = Host::new("d");
    let table = Table::new("berth-test");
    let (cmds, mut applied) = Applied::rebuild(&table, Default::default());
    berth_proxy::apply(&host.nft, cmds).await.unwrap();
    let changes = every_kind(&[POD_A, POD_B]);
    host.batch(&table, &applied.changes(&changes)).expect("the kernel accepts every kind of rule");
    applied.commit(changes);
    let (text, _) = listing(&host, &table);
    for expected in [
        "numgen random mod 2 vmap { 0 : goto endpoint-default/sticky/tcp/http__10.244.7.2/8080",
        "ip saddr @affinity-default/sticky/tcp/http__10.244.7.2/8080 goto endpoint-default/sticky/tcp/http__10.244.7.2/8080",
        "update @affinity-default/sticky/tcp/http__10.244.7.3/8080 { ip saddr }",
        "timeout 3h",
        "ip saddr != 10.244.7.0/24 jump mark-for-masquerade",
        "fib saddr type local goto service-default/local/tcp/http",
        "ip saddr 10.244.7.0/24 goto service-default/local/tcp/http",
        "meta l4proto udp dnat to 10.244.7.2:8080",
        "ip saddr 10.244.7.3 jump mark-for-masquerade",
        "10.96.7.14 . tcp . 80 : goto reject-chain",
        "tcp . 30082 : goto external-default/local/tcp/http",
        "192.0.2.7 . tcp . 80 : goto external-default/local/tcp/http",
    ] {
        assert!(text.contains(expected), "missing `{expected}`:\n{text}");
    }
}

#[tokio::test]
async fn a_refused_batch_names_the_step_and_its_errno_and_changes_nothing() {
    let host = Host::new("e");
    let table = Table::new("berth-test");
    let (cmds, _) = Applied::rebuild(&table, Default::default());
    berth_proxy::apply(&host.nft, cmds).await.unwrap();
    let err = host
        .batch(&table, &[Step::AddChain("new-chain".into()), Step::DeleteChain("no-such-chain".into())])
        .unwrap_err();
    let said = err.to_string();
    assert!(said.contains("delete chain no-such-chain") && said.contains("ENOENT"), "{said}");
    assert!(!host.ruleset().contains("new-chain"), "the batch is all or nothing:\n{}", host.ruleset());
    host.batch(&table, &[Step::AddChain("new-chain".into())]).expect("the socket serves the next batch");
    assert!(host.ruleset().contains("new-chain"));
}

#[test]
fn a_step_without_a_netlink_encoding_goes_through_nft_and_the_socket_is_kept() {
    let host = Host::new("f");
    let nft = host.nft.clone();
    let kept = Host::within(&host.node, move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let table = Table::new("berth-test");
            let (cmds, _) = Applied::rebuild(&table, Default::default());
            berth_proxy::apply(&nft, cmds).await.unwrap();
            let mut socket = None;
            let odd = vec![
                Step::AddChain("odd".into()),
                Step::AddRule("odd".into(), vec![nftables::stmt::Statement::Reject(None)]),
            ];
            apply_changes(&mut socket, &nft, &table, odd).await.expect("nft takes what netlink cannot write");
            let kept = socket.is_some();
            apply_changes(&mut socket, &nft, &table, vec![Step::AddChain("plain".into())]).await.unwrap();
            kept
        })
    })
    .join()
    .unwrap();
    assert!(kept, "the socket stays open");
    let ruleset = host.ruleset();
    assert!(ruleset.contains("chain odd {\n\t\treject") && ruleset.contains("chain plain"), "{ruleset}");
}

#[tokio::test]
async fn thousands_of_services_fit_in_one_acknowledged_batch() {
    let host = Host::new("g");
    let table = Table::new("berth-test");
    let (cmds, mut applied) = Applied::rebuild(&table, Default::default());
    berth_proxy::apply(&host.nft, cmds).await.unwrap();
    let changes: Vec<_> = (0..2000u32)
        .map(|i| {
            let mut p = port(&[POD_A, POD_B]);
            p.service = ServiceKey::new("many", &format!("svc-{i}"));
            p.cluster_ips = vec![Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 97, 0, 0)) + i)];
            p.node_port = None;
            (p.service.clone(), Some(rules(p)))
        })
        .collect();
    let steps = applied.changes(&changes);
    assert!(steps.len() > 15_000, "{}", steps.len());
    host.batch(&table, &steps).expect("the kernel acknowledges every message");
    applied.commit(changes);
    let (text, _) = listing(&host, &table);
    assert_eq!(text.matches("chain service-many/").count(), 2000);
    assert_eq!(text.matches("numgen random mod 2 vmap").count(), 2000);
}
