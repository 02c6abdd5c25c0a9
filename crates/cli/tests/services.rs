//! End to end: Services and cluster DNS as a user meets them after `berth up`, with runc and
//! gVisor pods as servers and clients: by ClusterIP, by DNS name (short and full), by NodePort
//! from the host; an endpoint that turns unready leaves the rotation; a Service scaled to zero
//! refuses connections and serves again once scaled back; `berth down --stop-pods` leaves no
//! table of the proxy behind.
//!
//! Needs root, runc, runsc, nftables, the CNI plugins, busybox-static, docker-registry and kubectl.

mod cluster;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use berth_testenv::images::{Format, busybox_image};
use berth_testenv::{Registry, block_on};
use cluster::*;
use serde_json::{Value, json};

/// A Deployment of busybox httpd servers on port 8080 that answer with their pod's name and are
/// ready while `/tmp/ready` exists.
fn servers(name: &str, image: &str, class: Option<&str>, replicas: u32) -> Value {
    let script = "mkdir -p /www && hostname > /www/index.html && touch /tmp/ready && exec httpd -f -p 8080 -h /www";
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {
                "runtimeClassName": class,
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "httpd", "image": image, "command": ["sh", "-c", script],
                    "ports": [{"containerPort": 8080}],
                    "readinessProbe": {"exec": {"command": ["cat", "/tmp/ready"]}, "periodSeconds": 1}}]}}}
    })
}

fn service(name: &str, type_: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": format!("{name}{}", if type_ == "NodePort" { "-np" } else { "" })},
        "spec": {"type": type_, "selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8080}]}})
}

/// A shell function printing the IPv4 address a name resolves to in the pod.
const RESOLVE: &str =
    "resolve() { nslookup \"$1\" 2>/dev/null | sed -n 's/^Address: \\([0-9.]*\\)$/\\1/p' | tail -1; };";

fn apply(cluster: &Cluster, objects: &[Value]) {
    // One YAML stream of JSON documents (a `List` would make kubectl fetch protobuf OpenAPI v2).
    let path = cluster.dir.path().join("manifest.yaml");
    let docs: Vec<String> = objects.iter().map(Value::to_string).collect();
    std::fs::write(&path, docs.join("\n---\n")).unwrap();
    cluster.kubectl_ok(&["apply", "-f", &path.to_string_lossy()]);
}

/// Runs `script` in a busybox pod of `class` until it ends; its logs.
fn client(cluster: &Cluster, name: &str, image: &str, class: Option<&str>, script: &str) -> String {
    apply(
        cluster,
        &[json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
            "runtimeClassName": class, "restartPolicy": "Never",
            "containers": [{"name": "client", "image": image, "command": ["sh", "-c", script]}]}})],
    );
    eventually(Duration::from_secs(120), &format!("client {name} to finish"), || {
        let phase = cluster.kubectl_ok(&["get", "pod", name, "-o", "jsonpath={.status.phase}"]);
        matches!(phase.as_str(), "Succeeded" | "Failed").then_some(())
    });
    cluster.kubectl_ok(&["logs", name])
}

/// `GET /` over plain TCP from the host: the body, or the connection's error.
fn get(addr: SocketAddr) -> std::io::Result<String> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
    conn.set_read_timeout(Some(Duration::from_secs(3)))?;
    conn.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer)?;
    Ok(answer.split_once("\r\n\r\n").map(|(_, body)| body.trim().to_string()).unwrap_or_default())
}

fn pod_names(cluster: &Cluster, app: &str) -> BTreeSet<String> {
    let names =
        cluster.kubectl_ok(&["get", "pods", "-l", &format!("app={app}"), "-o", "jsonpath={.items[*].metadata.name}"]);
    names.split_whitespace().map(String::from).collect()
}

fn cluster_ip(cluster: &Cluster, service: &str) -> String {
    cluster.kubectl_ok(&["get", "service", service, "-o", "jsonpath={.spec.clusterIP}"])
}

fn nft_tables() -> BTreeSet<String> {
    let out = Command::new("nft").args(["list", "tables"]).output().unwrap();
    text(&out.stdout).lines().map(String::from).collect()
}

#[test]
fn services_route_by_cluster_ip_dns_name_and_node_port_for_runc_and_gvisor_pods() {
    let _one = one_cluster_at_a_time();
    let registry = Registry::start();
    let busybox = block_on(registry.push_image("busybox", "1.36", &busybox_image(Format::Oci))).reference;
    let cluster = Cluster::new();
    cluster.up_ok();
    let agent_log = std::fs::read_to_string(cluster.data_dir().join("logs/agent.log")).unwrap();
    let table = agent_log.split("--proxy-table ").nth(1).and_then(|rest| rest.split_whitespace().next()).unwrap();
    let table = format!("table ip {table}");
    eventually(Duration::from_secs(30), "the agent's nftables table", || nft_tables().contains(&table).then_some(()));

    apply(
        &cluster,
        &[
            servers("web", &busybox, None, 3),
            service("web", "ClusterIP"),
            service("web", "NodePort"),
            servers("gweb", &busybox, Some("gvisor"), 2),
            service("gweb", "ClusterIP"),
        ],
    );
    for deployment in ["web", "gweb"] {
        let out = cluster.kubectl(&["rollout", "status", &format!("deployment/{deployment}"), "--timeout=180s"]);
        assert!(out.status.success(), "{deployment}: {}\n{}", text(&out.stderr), cluster.logs());
    }
    let (web, gweb) = (pod_names(&cluster, "web"), pod_names(&cluster, "gweb"));
    let web_ip = cluster_ip(&cluster, "web");

    // A runc pod: by short name, by full name (both through cluster DNS) and to gVisor servers.
    // The static busybox's wget cannot resolve names (glibc's NSS needs dlopen), so names go
    // through nslookup, which asks the pod's resolv.conf nameserver and searches its domains.
    let script = format!(
        "{RESOLVE} nslookup web; for name in web web.default.svc.cluster.local gweb; do \
         echo \"answer=$(timeout 10 wget -qO- http://$(resolve $name))\"; done; \
         echo api=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT \
           $(echo | timeout 10 nc $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT | od -An -tu1 -N1)"
    );
    let logs = client(&cluster, "runc-client", &busybox, None, &script);
    // In-cluster clients reach the API server through the kubernetes Service: a TLS server
    // answers there (its first byte is a TLS record type, here an alert for the bad hello).
    let api = logs.lines().find_map(|l| l.strip_prefix("api=")).unwrap_or_default();
    assert_eq!(api.trim(), "10.96.0.1:443 21", "{logs}");
    assert!(logs.contains(&web_ip), "nslookup answers the ClusterIP: {logs}");
    let answers: Vec<&str> = logs.lines().filter_map(|l| l.strip_prefix("answer=")).collect();
    assert_eq!(answers.len(), 3, "{logs}");
    assert!(web.contains(answers[0]) && web.contains(answers[1]), "web pods answer: {logs}");
    assert!(gweb.contains(answers[2]), "a gVisor pod answers: {logs}");

    // A gVisor pod: cluster DNS, and the runc servers through their Service.
    let script = format!(
        "{RESOLVE} nslookup web.default.svc.cluster.local; for i in 1 2 3 4 5; do \
         a=$(timeout 10 wget -qO- http://$(resolve web)) && echo \"answer=$a\" && break; sleep 1; done"
    );
    let logs = client(&cluster, "gvisor-client", &busybox, Some("gvisor"), &script);
    assert!(logs.contains(&web_ip), "gVisor pods use cluster DNS: {logs}");
    let answer = logs.lines().find_map(|l| l.strip_prefix("answer=")).unwrap_or_default();
    assert!(web.contains(answer), "a gVisor pod reaches the Service: {logs}");

    // From the host: the ClusterIP spreads over the endpoints; the NodePort on the node's address.
    let service: SocketAddr = format!("{web_ip}:80").parse().unwrap();
    let seen: BTreeSet<String> = (0..30).map(|_| get(service).expect("the ClusterIP answers")).collect();
    assert!(seen.len() >= 2 && seen.is_subset(&web), "several endpoints answer: {seen:?}");
    let node_ip = cluster.kubectl_ok(&[
        "get",
        "nodes",
        "-o",
        r#"jsonpath={.items[0].status.addresses[?(@.type=="InternalIP")].address}"#,
    ]);
    let node_port = cluster.kubectl_ok(&["get", "service", "web-np", "-o", "jsonpath={.spec.ports[0].nodePort}"]);
    let answer = get(format!("{node_ip}:{node_port}").parse().unwrap()).expect("the NodePort answers");
    assert!(web.contains(&answer), "{answer}");

    // An endpoint that turns unready leaves the rotation.
    let leaving = web.iter().next().unwrap().clone();
    cluster.kubectl_ok(&["exec", &leaving, "--", "rm", "/tmp/ready"]);
    let started = Instant::now();
    eventually(Duration::from_secs(30), "the unready pod to leave the rotation", || {
        let seen: BTreeSet<String> = (0..20).filter_map(|_| get(service).ok()).collect();
        (!seen.contains(&leaving) && !seen.is_empty()).then_some(())
    });
    eprintln!("an unready endpoint left the rotation within {:?} of its probe failing", started.elapsed());

    // Scaled to zero: connections are refused at once; scaled back: served again.
    cluster.kubectl_ok(&["scale", "deployment/web", "--replicas=0"]);
    eventually(Duration::from_secs(60), "connections to an empty Service to be refused", || {
        let refused = get(service).err()?;
        (refused.kind() == std::io::ErrorKind::ConnectionRefused).then_some(())
    });
    cluster.kubectl_ok(&["scale", "deployment/web", "--replicas=2"]);
    eventually(Duration::from_secs(120), "the Service to serve again", || get(service).ok());

    let down = cluster.down(true);
    assert!(down.status.success(), "berth down --stop-pods: {}{}", text(&down.stderr), text(&down.stdout));
    assert!(!nft_tables().contains(&table), "no table of the proxy is left");
}
