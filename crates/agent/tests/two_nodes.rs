//! Pod networks span nodes: two nodes on one host, each a network namespace of its own with its
//! `berth runtime` and `berth agent` (the Service proxy on nftables, in a table of the test's own),
//! joined by a veth each to a bridge on the host that stands for the nodes' network; the real
//! `berth server` on the host, bound to the bridge's address, gives each node a block of the
//! cluster CIDR. Each runtime starts with an empty CNI conf dir, writes berth's default network
//! and moves it to its node's pod CIDR; each agent routes the other node's pod CIDR via its
//! InternalIP (host-gw). A pod on one node reaches a pod on the other by IP, both ways, and by
//! Service; `kubectl get nodes -o wide` shows the nodes' InternalIPs; no two pods share an IP and
//! each has an address of its node's pod CIDR.
//!
//! Needs root, iproute2, nsenter, nftables, runc, the CNI plugins, busybox-static,
//! docker-registry and kubectl.

mod common;

use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use berth_testenv::Registry;
use berth_testenv::images::{Format, busybox_image};
use common::{Agent, Runtime, Server, condition, eventually_within};
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

const NODES: [&str; 2] = ["node-a", "node-b"];
/// Starting two runtimes and agents and their pods in a debug build on 2 busy cores.
const PATIENCE: Duration = Duration::from_secs(180);

/// `ip ARGS` (or any command), asserted to succeed.
fn run(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The nodes' network: a bridge on the host with `.1` of a /24, and per node a network namespace
/// whose `eth0` (a veth whose peer is on the bridge) has `.10 + i` and the default route via the
/// bridge. Everything is removed on drop.
struct NodeNetwork {
    bridge: String,
    /// (netns, host end of its veth)
    nodes: Vec<(String, String)>,
    subnet: u8,
}

impl NodeNetwork {
    fn create(count: usize) -> NodeNetwork {
        let pid = std::process::id();
        let subnet = (pid % 250) as u8;
        let mut network = NodeNetwork { bridge: format!("b2n{pid:x}"), nodes: Vec::new(), subnet };
        run("ip", &["link", "add", &network.bridge, "type", "bridge"]);
        run("ip", &["addr", "add", &format!("{}/24", network.gateway()), "dev", &network.bridge]);
        run("ip", &["link", "set", &network.bridge, "up"]);
        for i in 0..count {
            let (netns, veth) = (format!("berth2n-{pid}-{i}"), format!("v2n{pid:x}n{i}"));
            run("ip", &["netns", "add", &netns]);
            network.nodes.push((netns.clone(), veth.clone()));
            run("ip", &["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &netns]);
            run("ip", &["link", "set", &veth, "master", &network.bridge, "up"]);
            run("ip", &["-n", &netns, "addr", "add", &format!("{}/24", network.node_ip(i)), "dev", "eth0"]);
            run("ip", &["-n", &netns, "link", "set", "eth0", "up"]);
            run("ip", &["-n", &netns, "link", "set", "lo", "up"]);
            run("ip", &["-n", &netns, "route", "add", "default", "via", &network.gateway().to_string()]);
            // /proc/sys/net is the reader's network namespace's.
            let sysctls = "echo 1 > /proc/sys/net/ipv4/ip_forward && f=/proc/sys/net/bridge/bridge-nf-call-iptables \
                           && if [ -e $f ]; then echo 1 > $f; fi";
            run("ip", &["netns", "exec", &netns, "sh", "-c", sysctls]);
        }
        network
    }

    fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(172, 31, self.subnet, 1)
    }

    fn node_ip(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(172, 31, self.subnet, 10 + i as u8)
    }

    fn netns(&self, i: usize) -> &str {
        &self.nodes[i].0
    }

    /// `ip -n NETNS ARGS`: its stdout.
    fn ip_in(&self, i: usize, args: &[&str]) -> String {
        let out = Command::new("ip").args(["-n", self.netns(i)]).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for NodeNetwork {
    fn drop(&mut self) {
        for (netns, veth) in &self.nodes {
            let _ = Command::new("ip").args(["link", "del", veth]).output();
            let _ = Command::new("ip").args(["netns", "del", netns]).output();
        }
        let _ = Command::new("ip").args(["link", "del", &self.bridge]).output();
    }
}

/// A TCP forwarder on the host from `listen` to `target` (the loopback registry), so that the
/// runtimes in the nodes' network namespaces can pull from it. Stops accepting on drop.
struct Forwarder {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Forwarder {
    fn start(listen: Ipv4Addr, target: SocketAddr) -> Forwarder {
        let listener = TcpListener::bind((listen, 0)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let Ok(upstream) = TcpStream::connect(target) else { continue };
                        for (mut from, mut to) in
                            [(client.try_clone().unwrap(), upstream.try_clone().unwrap()), (upstream, client)]
                        {
                            std::thread::spawn(move || {
                                let _ = std::io::copy(&mut from, &mut to);
                                let _ = to.shutdown(std::net::Shutdown::Write);
                            });
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
                    Err(e) => panic!("forwarder accept: {e}"),
                }
            }
        });
        Forwarder { addr, stop, thread: Some(thread) }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The cluster: dropped in field order, agents first, then the runtimes (which remove the pods
/// left), the server, and last the nodes' network.
struct Cluster {
    agents: Vec<Agent>,
    runtimes: Vec<Runtime>,
    server: Server,
    image: String,
    _forwarder: Forwarder,
    _registry: Registry,
    dir: tempfile::TempDir,
    network: NodeNetwork,
}

impl Cluster {
    async fn start(cluster_cidr: &str) -> Cluster {
        let started = Instant::now();
        let network = NodeNetwork::create(NODES.len());
        let registry = Registry::start();
        let busybox = tokio::task::spawn_blocking(|| busybox_image(Format::Oci)).await.unwrap();
        let pushed = registry.push_image("busybox", "1.0", &busybox).await;
        eprintln!("nodes' network and registry with busybox after {:?}", started.elapsed());
        let forwarder = Forwarder::start(network.gateway(), registry.host().parse().unwrap());
        let image = pushed.reference.replacen(registry.host(), &forwarder.addr.to_string(), 1);
        let dir = tempfile::tempdir().unwrap();
        let gateway = network.gateway().to_string();
        let (server, runtimes) = {
            let netns: Vec<String> = (0..NODES.len()).map(|i| network.netns(i).to_string()).collect();
            let registry_host = forwarder.addr.to_string();
            let cluster_cidr = cluster_cidr.to_string();
            tokio::task::spawn_blocking(move || {
                let dns_port = common::free_port().to_string();
                let server = Server::start_with(&[
                    "--bind-address",
                    &gateway,
                    "--cluster-dns-port",
                    &dns_port,
                    "--cluster-cidr",
                    &cluster_cidr,
                ]);
                eprintln!("server ready after {:?}", started.elapsed());
                let runtimes: Vec<Runtime> = netns
                    .iter()
                    .map(|ns| {
                        Runtime::builder()
                            .in_netns(ns)
                            .berth_default_network()
                            .insecure_registry(&registry_host)
                            .start()
                    })
                    .collect();
                eprintln!("runtimes answering after {:?}", started.elapsed());
                (server, runtimes)
            })
            .await
            .unwrap()
        };
        let mut agents = Vec::new();
        for (i, node) in NODES.iter().enumerate() {
            let kubeconfig = common::node_kubeconfig(&server, node, dir.path());
            let config = common::agent_toml(&[("berth", &runtimes[i])], false);
            let extra = ["--proxy-mode", "nftables", "--proxy-table", "berth-test", "--cluster-cidr", cluster_cidr];
            agents.push(Agent::start_in_netns(network.netns(i), node, &config, &kubeconfig, &extra));
        }
        Cluster { agents, runtimes, server, image, _forwarder: forwarder, _registry: registry, dir, network }
    }

    fn apply(&self, manifest: &Value) {
        let path = self.dir.path().join("manifest.json");
        std::fs::write(&path, manifest.to_string()).unwrap();
        self.server.kubectl_ok(&["apply", "-f", &path.to_string_lossy()]);
    }

    fn get(&self, kind: &str, name: &str, jsonpath: &str) -> String {
        self.server.kubectl_ok(&["get", kind, name, "-o", &format!("jsonpath={jsonpath}")])
    }

    /// A busybox httpd on port 8080 of `node`, answering with its pod's name, ready once it serves.
    fn server_pod(&self, name: &str, node: &str) {
        let script = "mkdir -p /www && hostname > /www/index.html && exec httpd -f -v -p 8080 -h /www";
        self.apply(&json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "httpd", "image": self.image, "command": ["sh", "-c", script],
                    "ports": [{"containerPort": 8080}],
                    "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}]}}));
    }

    /// A busybox pod on `node` that runs `script` and ends.
    fn client_pod(&self, name: &str, node: &str, script: &str) {
        self.apply(&json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "client", "image": self.image, "command": ["sh", "-c", script]}]}}));
    }

    async fn node(&self, name: &str) -> Option<Node> {
        self.server.node(name).await
    }
}

/// `ip` (an IPv4 address) is inside `cidr` (`a.b.c.d/n`).
fn in_cidr(ip: &str, cidr: &str) -> bool {
    let (net, bits) = cidr.split_once('/').unwrap();
    let (ip, net): (Ipv4Addr, Ipv4Addr) = (ip.parse().unwrap(), net.parse().unwrap());
    let mask = u32::MAX.checked_shl(32 - bits.parse::<u32>().unwrap()).unwrap_or(0);
    u32::from(ip) & mask == u32::from(net) & mask
}

/// Fetches `url` until it answers (for at most a minute), then prints `<label>=<answer>
/// attempts=<n>`.
fn fetch(label: &str, url: &str) -> String {
    format!(
        "i=0; until a=$(timeout 10 wget -qO- {url}); do i=$((i+1)); [ $i -ge 60 ] && break; sleep 1; done; \
         echo \"{label}=$a attempts=$((i+1))\"; "
    )
}

/// `label=<answer>` of a client's logs: the answer.
fn answer<'a>(logs: &'a str, label: &str) -> &'a str {
    let line = logs.lines().find_map(|l| l.strip_prefix(&format!("{label}="))).unwrap_or_default();
    line.split_whitespace().next().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_reach_pods_and_services_on_another_node_over_host_gw_routes() {
    let started = Instant::now();
    let cluster_cidr = format!("10.{}.0.0/16", 220 + std::process::id() % 30);
    let mut c = Cluster::start(&cluster_cidr).await;
    eprintln!("cluster started in {:?}", started.elapsed());

    // Both nodes Ready, with their own InternalIP and pod CIDR.
    let mut cidrs = Vec::new();
    for (i, name) in NODES.iter().enumerate() {
        let node = eventually_within(PATIENCE, &format!("{name} Ready with a pod CIDR"), || async {
            let node = c.node(name).await?;
            let ready = condition(&node, "Ready").is_some_and(|c| c.status == "True");
            (ready && node.spec.as_ref()?.pod_cidr.is_some()).then_some(node)
        })
        .await;
        eprintln!("{name} Ready with a pod CIDR after {:?}", started.elapsed());
        let addresses = node.status.unwrap().addresses.unwrap();
        let internal: Vec<_> = addresses.iter().filter(|a| a.type_ == "InternalIP").map(|a| &a.address).collect();
        assert_eq!(internal, [&c.network.node_ip(i).to_string()], "{name}'s InternalIP");
        let cidr = node.spec.unwrap().pod_cidr.unwrap();
        assert!(in_cidr(cidr.split('/').next().unwrap(), &cluster_cidr), "{name}'s {cidr} in {cluster_cidr}");
        cidrs.push(cidr);
    }
    assert_ne!(cidrs[0], cidrs[1], "each node has a pod CIDR of its own");
    let wide = c.server.kubectl_ok(&["get", "nodes", "-o", "wide"]);
    eprintln!("{wide}");
    for (i, name) in NODES.iter().enumerate() {
        let ip = c.network.node_ip(i).to_string();
        let line = wide.lines().find(|l| l.split_whitespace().next() == Some(*name)).unwrap_or_default();
        assert!(line.split_whitespace().any(|w| w == ip), "{name} with InternalIP {ip} in:\n{wide}");
    }

    // Each runtime moved berth's default network to its node's pod CIDR, and each agent routes
    // the other node's pod CIDR via that node's InternalIP. Pods are created only after that, so
    // that none gets an address of the runtime's default range.
    for (i, runtime) in c.runtimes.iter().enumerate() {
        let conflist = runtime.cni_conf_dir().join("10-berth.conflist");
        eventually_within(PATIENCE, &format!("{} to follow its pod CIDR", NODES[i]), || async {
            std::fs::read_to_string(&conflist).ok()?.contains(&format!("\"{}\"", cidrs[i])).then_some(())
        })
        .await;
        let (other_cidr, other_ip) = (&cidrs[1 - i], c.network.node_ip(1 - i).to_string());
        let routes = eventually_within(PATIENCE, &format!("{}'s route to the other pods", NODES[i]), || async {
            let routes = c.network.ip_in(i, &["-4", "route", "show", "proto", "148"]);
            routes.contains(&format!("{other_cidr} via {other_ip} ")).then_some(routes)
        })
        .await;
        eprintln!("{}: host-gw routes after {:?}: {}", NODES[i], started.elapsed(), routes.trim());
    }

    // A server on each node; a Service in front of node-b's.
    c.server_pod("web-a", NODES[0]);
    c.server_pod("web-b", NODES[1]);
    c.apply(&json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-b"},
        "spec": {"selector": {"app": "web-b"}, "ports": [{"port": 80, "targetPort": 8080}]}}));
    let mut server_ips = Vec::new();
    for name in ["web-a", "web-b"] {
        let ip = eventually_within(PATIENCE, &format!("{name} ready"), || async {
            let ready = c.get("pod", name, r#"{.status.conditions[?(@.type=="Ready")].status}"#);
            let ip = c.get("pod", name, "{.status.podIP}");
            (ready == "True" && !ip.is_empty()).then_some(ip)
        })
        .await;
        eprintln!("{name} ready at {ip} after {:?}", started.elapsed());
        server_ips.push(ip);
    }
    let service_ip = c.get("service", "web-b", "{.spec.clusterIP}");
    eventually_within(PATIENCE, "web-b's endpoint", || async {
        let ips = c.server.kubectl_ok(&[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=web-b",
            "-o",
            "jsonpath={.items[*].endpoints[*].addresses[*]}",
        ]);
        (ips.trim() == server_ips[1]).then_some(())
    })
    .await;

    // node-a's client: node-b's server by pod IP and by Service; node-b's client: node-a's server.
    let clients_created = Instant::now();
    let script_a =
        fetch("pod", &format!("http://{}:8080", server_ips[1])) + &fetch("service", &format!("http://{service_ip}:80"));
    c.client_pod("client-a", NODES[0], &script_a);
    c.client_pod("client-b", NODES[1], &fetch("pod", &format!("http://{}:8080", server_ips[0])));
    let mut logs = Vec::new();
    for name in ["client-a", "client-b"] {
        eventually_within(PATIENCE, &format!("{name} to finish"), || async {
            let phase = c.get("pod", name, "{.status.phase}");
            matches!(phase.as_str(), "Succeeded" | "Failed").then_some(())
        })
        .await;
        let log = c.server.kubectl_ok(&["logs", name]);
        eprintln!("{name} finished {:?} after its creation:\n{}", clients_created.elapsed(), log.trim());
        logs.push(log);
    }
    assert_eq!(answer(&logs[0], "pod"), "web-b", "node-a's pod reaches node-b's by IP: {}", logs[0]);
    assert_eq!(answer(&logs[0], "service"), "web-b", "node-a's pod reaches node-b's by Service: {}", logs[0]);
    assert_eq!(answer(&logs[1], "pod"), "web-a", "node-b's pod reaches node-a's by IP: {}", logs[1]);
    // Pods see each other's own addresses (busybox httpd -v logs each client's): nothing
    // masquerades traffic between the cluster's pods.
    for (server, client) in [("web-b", "client-a"), ("web-a", "client-b")] {
        let served = c.server.kubectl_ok(&["logs", server]);
        let client_ip = c.get("pod", client, "{.status.podIP}");
        eprintln!("{server} served:\n{}", served.trim());
        assert!(served.contains(&format!("[::ffff:{client_ip}]")), "{server} saw {client} at {client_ip}: {served}");
    }

    // No two pods share an address; each has one of its node's pod CIDR.
    let out = c.server.kubectl_ok(&[
        "get",
        "pods",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.podIP}{"\n"}{end}"#,
    ]);
    eprintln!("pods:\n{out}");
    let pods: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(pods.len(), 4, "{out}");
    let mut ips: Vec<&str> = Vec::new();
    for pod in &pods {
        let [name, node, ip] = pod[..] else { panic!("a pod without an address: {out}") };
        let cidr = &cidrs[NODES.iter().position(|n| *n == node).unwrap()];
        assert!(in_cidr(ip, cidr), "{name} on {node} at {ip}, outside {cidr}");
        assert!(!ips.contains(&ip), "{ip} twice: {out}");
        ips.push(ip);
    }
    for agent in &mut c.agents {
        agent.check_alive();
    }
    eprintln!("test done in {:?}", started.elapsed());
}
