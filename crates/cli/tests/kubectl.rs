//! End-to-end: the real kubectl against the real `berth server`.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Server, stderr, stdout};

const RUNTIME_CLASSES: &str = r#"
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: gvisor
handler: runsc
overhead:
  podFixed:
    memory: 64Mi
    cpu: 100m
scheduling:
  nodeSelector:
    sandbox: gvisor
  tolerations:
  - key: sandbox
    operator: Exists
    effect: NoSchedule
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: native
handler: runc
"#;

fn pod(name: &str, extra_spec: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels:\n    app: web\nspec:\n{extra_spec}  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sleep, '3600']\n"
    )
}

#[test]
fn kubectl_applies_lists_describes_and_deletes_namespaces_pods_and_runtimeclasses() {
    let s = Server::start();
    let ns = s.kubectl_ok(&["get", "namespaces"]);
    for want in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(ns.contains(want), "missing namespace {want} in:\n{ns}");
    }
    assert!(s.kubectl_ok(&["create", "namespace", "team-a"]).contains("namespace/team-a created"));
    // The controllers give the new namespace its default ServiceAccount and the cluster CA.
    let sa = kubectl_eventually(&s, &["get", "serviceaccount", "default", "-n", "team-a", "-o", "name"]);
    assert_eq!(sa.trim(), "serviceaccount/default");
    let ca = kubectl_eventually(
        &s,
        &["get", "configmap", "kube-root-ca.crt", "-n", "team-a", "-o", "jsonpath={.data.ca\\.crt}"],
    );
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
    assert_eq!(ca, kubeconfig_ca(&s), "kube-root-ca.crt holds the CA the admin kubeconfig trusts");

    let out = s.apply(RUNTIME_CLASSES);
    assert!(out.status.success(), "{}", stderr(&out));
    let rc = s.kubectl_ok(&["get", "runtimeclasses"]);
    assert!(rc.contains("HANDLER") && rc.contains("gvisor") && rc.contains("runsc"), "{rc}");

    let out = s.kubectl_stdin(&["apply", "-n", "team-a", "-f", "-"], &pod("web", "  runtimeClassName: native\n"));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("pod/web created"));
    // Applying the same manifest again changes nothing.
    let out = s.kubectl_stdin(&["apply", "-n", "team-a", "-f", "-"], &pod("web", "  runtimeClassName: native\n"));
    assert!(stdout(&out).contains("pod/web unchanged"), "{}{}", stdout(&out), stderr(&out));
    // A changed image is patched in.
    let changed = pod("web", "  runtimeClassName: native\n").replace("busybox:1.36", "busybox:1.37");
    let out = s.kubectl_stdin(&["apply", "-n", "team-a", "-f", "-"], &changed);
    assert!(stdout(&out).contains("pod/web configured"), "{}{}", stdout(&out), stderr(&out));
    let image = s.kubectl_ok(&["get", "pod", "web", "-n", "team-a", "-o", "jsonpath={.spec.containers[0].image}"]);
    assert_eq!(image, "busybox:1.37");

    let wide = s.kubectl_ok(&["get", "pods", "-n", "team-a", "-o", "wide"]);
    for col in ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"] {
        assert!(wide.contains(col), "missing column {col}:\n{wide}");
    }
    assert!(wide.contains("web") && wide.contains("0/1") && wide.contains("Pending"), "{wide}");
    let both = s.kubectl_ok(&["get", "runtimeclasses,pods", "-A", "-o", "wide"]);
    assert!(both.contains("runtimeclass.node.k8s.io/gvisor") && both.contains("pod/web"), "{both}");

    let described = s.kubectl_ok(&["describe", "pod", "web", "-n", "team-a"]);
    assert!(
        described.contains("Name:") && described.contains("team-a") && described.contains("busybox:1.37"),
        "{described}"
    );
    let described = s.kubectl_ok(&["describe", "runtimeclass", "gvisor"]);
    assert!(described.contains("runsc"), "{described}");

    let labelled = s.kubectl_ok(&["get", "pods", "-n", "team-a", "-l", "app in (web,api)", "-o", "name"]);
    assert_eq!(labelled.trim(), "pod/web");
    assert!(s.kubectl_ok(&["get", "pods", "-n", "team-a", "-l", "app!=web", "-o", "name"]).trim().is_empty());

    assert!(s.kubectl_ok(&["delete", "pod", "web", "-n", "team-a"]).contains("pod \"web\" deleted"));
    let out = s.kubectl(&["get", "pod", "web", "-n", "team-a"]);
    assert!(stderr(&out).contains("pods \"web\" not found"), "{}", stderr(&out));
    assert!(s.kubectl_ok(&["delete", "runtimeclass", "native"]).contains("deleted"));
    assert!(s.kubectl_ok(&["delete", "namespace", "team-a", "--timeout=30s"]).contains("namespace \"team-a\" deleted"));
    let out = s.kubectl(&["get", "namespace", "team-a"]);
    assert!(stderr(&out).contains("not found"), "{}", stderr(&out));
}

#[test]
fn kubectl_get_pods_watch_sees_added_modified_and_deleted() {
    let s = Server::start();
    let mut watch = Command::new("kubectl")
        .env("KUBECONFIG", s.kubeconfig())
        .args(["get", "pods", "-w", "--output-watch-events", "--request-timeout=0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(s.apply(&pod("w1", "")).status.success());
    s.kubectl_ok(&["label", "pod", "w1", "tier=front"]);
    s.kubectl_ok(&["delete", "pod", "w1"]);
    std::thread::sleep(Duration::from_millis(1500));
    let _ = watch.kill();
    let mut out = String::new();
    watch.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let _ = watch.wait();
    let events: Vec<&str> =
        out.lines().filter(|l| l.contains("w1")).map(|l| l.split_whitespace().next().unwrap()).collect();
    assert_eq!(events.first(), Some(&"ADDED"), "{out}");
    assert!(events.contains(&"MODIFIED"), "{out}");
    assert_eq!(events.last(), Some(&"DELETED"), "{out}");
}

#[test]
fn runtime_class_admission_messages_reach_kubectl_verbatim() {
    let s = Server::start();
    assert!(s.apply(RUNTIME_CLASSES).status.success());

    let out = s.apply(&pod("p1", "  runtimeClassName: missing\n"));
    assert!(!out.status.success());
    assert!(stderr(&out).contains("pod rejected: RuntimeClass \"missing\" not found"), "{}", stderr(&out));

    let out = s.apply(&pod("p2", "  runtimeClassName: gvisor\n  nodeSelector:\n    sandbox: runc\n"));
    assert!(
        stderr(&out).contains(
            "conflict: runtimeClass.scheduling.nodeSelector[sandbox] = gvisor; pod.spec.nodeSelector[sandbox] = runc"
        ),
        "{}",
        stderr(&out)
    );

    let out = s.apply(&pod("p3", "  runtimeClassName: gvisor\n  overhead:\n    memory: 1Gi\n"));
    assert!(
        stderr(&out).contains("pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead"),
        "{}",
        stderr(&out)
    );

    // An admitted pod carries the class's overhead, node selector and tolerations (after the
    // DefaultTolerationSeconds ones, which that plugin adds first, as in Kubernetes).
    let out = s.apply(&pod("p4", "  runtimeClassName: gvisor\n"));
    assert!(out.status.success(), "{}", stderr(&out));
    let got = s.kubectl_ok(&[
        "get",
        "pod",
        "p4",
        "-o",
        "jsonpath={.spec.overhead.memory} {.spec.nodeSelector.sandbox} {.spec.tolerations[*].key}",
    ]);
    assert_eq!(got, "64Mi gvisor node.kubernetes.io/not-ready node.kubernetes.io/unreachable sandbox");

    // Rejected pods were not stored.
    let names = s.kubectl_ok(&["get", "pods", "-o", "name"]);
    assert_eq!(names.trim(), "pod/p4");
}

#[test]
fn runtime_class_handler_cannot_be_changed() {
    let s = Server::start();
    assert!(s.apply(RUNTIME_CLASSES).status.success());
    let out = s.kubectl(&["patch", "runtimeclass", "native", "--type=merge", "-p", r#"{"handler":"crun"}"#]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("handler: Invalid value: \"crun\": field is immutable"), "{}", stderr(&out));
    assert_eq!(s.kubectl_ok(&["get", "runtimeclass", "native", "-o", "jsonpath={.handler}"]), "runc");
    let out = s.apply(&RUNTIME_CLASSES.replace("handler: runc", "handler: crun"));
    assert!(stderr(&out).contains("field is immutable"), "{}", stderr(&out));
}

#[test]
fn default_runtime_class_is_filled_into_pods_that_name_none() {
    let s = Server::start();
    assert!(s.apply(RUNTIME_CLASSES).status.success());
    s.kubectl_ok(&["annotate", "runtimeclass", "native", "runtimeclass.berth.dev/is-default-class=true"]);
    assert!(s.apply(&pod("d1", "")).status.success());
    assert_eq!(s.kubectl_ok(&["get", "pod", "d1", "-o", "jsonpath={.spec.runtimeClassName}"]), "native");
}

#[test]
fn creating_in_a_missing_namespace_is_not_found() {
    let s = Server::start();
    let out = s.kubectl_stdin(&["create", "-n", "nope", "-f", "-"], &pod("x", ""));
    assert!(stderr(&out).contains("namespaces \"nope\" not found"), "{}", stderr(&out));
}

#[test]
fn unknown_fields_are_rejected_by_kubectl_strict_validation() {
    let s = Server::start();
    let out = s.apply(&pod("u1", "  bogusField: 1\n"));
    assert!(!out.status.success());
    assert!(stderr(&out).contains("unknown field \"spec.bogusField\""), "{}", stderr(&out));
    assert!(s.kubectl_ok(&["get", "pods", "-o", "name"]).trim().is_empty());
}

#[test]
fn kubectl_create_generators_and_scale_work() {
    let s = Server::start();
    // These commands send protobuf bodies.
    assert!(
        s.kubectl_ok(&["create", "deployment", "web", "--image=nginx", "--replicas=2", "--port=80"])
            .contains("created")
    );
    assert!(s.kubectl_ok(&["create", "configmap", "cfg", "--from-literal=a=b"]).contains("created"));
    assert!(s.kubectl_ok(&["create", "secret", "generic", "sec", "--from-literal=pw=s3cret"]).contains("created"));
    assert!(s.kubectl_ok(&["create", "serviceaccount", "bot"]).contains("created"));
    assert_eq!(s.kubectl_ok(&["get", "secret", "sec", "-o", "jsonpath={.data.pw}"]), "czNjcmV0");
    assert_eq!(s.kubectl_ok(&["get", "cm", "cfg", "-o", "jsonpath={.data.a}"]), "b");
    let d = s.kubectl_ok(&[
        "get",
        "deployment",
        "web",
        "-o",
        "jsonpath={.spec.replicas} {.spec.template.spec.containers[0].ports[0].containerPort}",
    ]);
    assert_eq!(d, "2 80");
    assert!(s.kubectl_ok(&["scale", "deployment", "web", "--replicas=5"]).contains("scaled"));
    assert_eq!(s.kubectl_ok(&["get", "deployment", "web", "-o", "jsonpath={.spec.replicas}"]), "5");
    let table = s.kubectl_ok(&["get", "deployments,configmaps,secrets,serviceaccounts"]);
    for want in ["deployment.apps/web", "configmap/cfg", "secret/sec", "serviceaccount/bot", "UP-TO-DATE"] {
        assert!(table.contains(want), "missing {want} in:\n{table}");
    }
}

fn deployment(name: &str, finalizers: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n  finalizers: [{finalizers}]\nspec:\n  replicas: 0\n  selector:\n    matchLabels:\n      app: {name}\n  template:\n    metadata:\n      labels:\n        app: {name}\n    spec:\n      containers:\n      - name: c\n        image: busybox:1.36\n"
    )
}

/// The finalizers the deployment had when its deletion began, read from the watch history after
/// `rv` (so whatever a garbage collector does afterwards does not matter).
fn finalizers_when_deleted(s: &Server, name: &str, rv: &str) -> Vec<String> {
    let path = format!(
        "/apis/apps/v1/namespaces/default/deployments?watch=1&resourceVersion={rv}&timeoutSeconds=1&fieldSelector=metadata.name%3D{name}"
    );
    let events = s.kubectl_ok(&["get", "--raw", &path]);
    let deleting = events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|e| e["object"]["metadata"].clone())
        .find(|m| m["deletionTimestamp"].is_string())
        .unwrap_or_else(|| panic!("no event of {name} with a deletionTimestamp in:\n{events}"));
    serde_json::from_value(deleting["finalizers"].clone()).unwrap_or_default()
}

#[test]
fn kubectl_delete_cascade_sends_its_propagation_policy() {
    let s = Server::start();
    // Each deployment is also held by a finalizer of its own, so it stays whatever else runs.
    for (name, cascade, finalizer) in [("orphaned", "orphan", "orphan"), ("fg", "foreground", "foregroundDeletion")] {
        let out = s.apply(&deployment(name, "example.com/hold"));
        assert!(out.status.success(), "{}", stderr(&out));
        let rv = s.kubectl_ok(&["get", "deployment", name, "-o", "jsonpath={.metadata.resourceVersion}"]);
        let cascade_flag = format!("--cascade={cascade}");
        let out = s.kubectl_ok(&["delete", "deployment", name, &cascade_flag, "--wait=false"]);
        assert!(out.contains(&format!("deployment.apps \"{name}\" deleted")), "{out}");
        assert_eq!(finalizers_when_deleted(&s, name, &rv), ["example.com/hold", finalizer], "{cascade}");
        let stamp = s.kubectl_ok(&["get", "deployment", name, "-o", "jsonpath={.metadata.deletionTimestamp}"]);
        assert!(!stamp.is_empty(), "{name} is not terminating");
    }
    // Background (kubectl's default) removes an object nothing holds at once.
    assert!(s.apply(&deployment("bg", "")).status.success());
    s.kubectl_ok(&["delete", "deployment", "bg", "--cascade=background"]);
    let out = s.kubectl(&["get", "deployment", "bg"]);
    assert!(stderr(&out).contains("deployments.apps \"bg\" not found"), "{}", stderr(&out));
}

#[test]
fn server_flags_set_the_seconds_of_the_default_tolerations() {
    let s = Server::start_with(&[
        "--default-not-ready-toleration-seconds",
        "60",
        "--default-unreachable-toleration-seconds",
        "0",
    ]);
    s.kubectl_ok(&["run", "p", "--image=busybox"]);
    let got = s.kubectl_ok(&[
        "get",
        "pod",
        "p",
        "-o",
        "jsonpath={range .spec.tolerations[*]}{.key}:{.effect}:{.tolerationSeconds} {end}",
    ]);
    assert_eq!(got.trim(), "node.kubernetes.io/not-ready:NoExecute:60 node.kubernetes.io/unreachable:NoExecute:0");
}

/// Polls kubectl until `f` accepts its output (the controllers work in the background).
/// A child process killed when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn controller_manager_alone_publishes_the_root_ca_file_it_is_given_to_every_namespace() {
    let s = Server::start_with(&["--controllers=-*"]);
    let ca = "-----BEGIN CERTIFICATE-----\nbundle from --root-ca-file\n-----END CERTIFICATE-----\n";
    let ca_file = s.dir.path().join("bundle.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let log = std::fs::File::create(s.dir.path().join("controller-manager.log")).unwrap();
    let _cm = Child(
        Command::new(env!("CARGO_BIN_EXE_berth"))
            .arg("controller-manager")
            .arg("--kubeconfig")
            .arg(s.kubeconfig())
            .arg("--root-ca-file")
            .arg(&ca_file)
            .args(["--leader-elect=false", "--controllers=serviceaccount,root-ca-cert-publisher"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting berth controller-manager"),
    );
    s.kubectl_ok(&["create", "namespace", "x"]);
    kubectl_eventually(&s, &["get", "serviceaccount", "default", "-n", "x"]);
    let published =
        kubectl_eventually(&s, &["get", "configmap", "kube-root-ca.crt", "-n", "x", "-o", "jsonpath={.data.ca\\.crt}"]);
    assert_eq!(published, ca);
}

/// The output of the first successful run of `kubectl args` within 30 s; panics with the last
/// failure after that.
fn kubectl_eventually(s: &Server, args: &[&str]) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = s.kubectl(args);
        if out.status.success() {
            return stdout(&out);
        }
        assert!(std::time::Instant::now() < deadline, "kubectl {args:?} kept failing: {}", stderr(&out));
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The CA bundle (PEM) the admin kubeconfig trusts, decoded from its certificate-authority-data.
fn kubeconfig_ca(s: &Server) -> String {
    let data =
        s.kubectl_ok(&["config", "view", "--raw", "-o", "jsonpath={.clusters[0].cluster.certificate-authority-data}"]);
    let mut base64 = Command::new("base64")
        .arg("--decode")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("running base64");
    std::io::Write::write_all(&mut base64.stdin.take().unwrap(), data.trim().as_bytes()).unwrap();
    let out = base64.wait_with_output().unwrap();
    assert!(out.status.success(), "base64 --decode: {}", stderr(&out));
    stdout(&out)
}

fn kubectl_until(s: &Server, args: &[&str], f: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = s.kubectl_ok(args);
        if f(&out) || std::time::Instant::now() > deadline {
            return out;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn kubectl_creates_and_exposes_services_and_shows_their_endpoints() {
    let s = Server::start_with(&["--service-cluster-ip-range", "10.100.0.0/24"]);
    let services = s.kubectl_ok(&["get", "services"]);
    for col in ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"] {
        assert!(services.contains(col), "missing column {col}:\n{services}");
    }
    assert!(
        services.contains("kubernetes") && services.contains("10.100.0.1") && services.contains("443/TCP"),
        "{services}"
    );
    // Bound to loopback, the server also serves where pods reach this host (the default route's
    // source address), and that is where the kubernetes Service sends them.
    let routable = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|u| u.connect("192.0.2.1:9").and_then(|()| u.local_addr()))
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|_| "127.0.0.1".into());
    let endpoints = s.kubectl_ok(&["get", "endpoints", "kubernetes"]);
    assert!(endpoints.contains(&format!("{routable}:{}", s.port)), "{endpoints}");
    let version = s.kubectl_ok(&["--server", &format!("https://{routable}:{}", s.port), "version", "-o", "json"]);
    assert!(version.contains("serverVersion"), "{version}");

    let out = s.kubectl_ok(&["create", "service", "clusterip", "db", "--tcp=5432:5432", "--clusterip=10.100.0.50"]);
    assert!(out.contains("service/db created"), "{out}");
    let out = s.kubectl(&["create", "service", "clusterip", "db2", "--tcp=5432:5432", "--clusterip=10.100.0.50"]);
    assert!(
        stderr(&out).contains("spec.clusterIPs: Invalid value: []string{\"10.100.0.50\"}: failed to allocate IP 10.100.0.50: provided IP is already allocated"),
        "{}",
        stderr(&out)
    );

    s.kubectl_ok(&["create", "deployment", "web", "--image=busybox", "--port=8080"]);
    let out = s.kubectl_ok(&["expose", "deployment", "web", "--port=80", "--target-port=8080", "--type=NodePort"]);
    assert!(out.contains("service/web exposed"), "{out}");
    let wide = s.kubectl_ok(&["get", "service", "web", "-o", "wide"]);
    assert!(wide.contains("NodePort") && wide.contains("80:3") && wide.contains("app=web"), "{wide}");

    // No node runs the pod: report it running and ready as a kubelet would.
    let pods = kubectl_until(&s, &["get", "pods", "-l", "app=web", "-o", "name"], |o| !o.trim().is_empty());
    let pod = pods.lines().next().expect("a pod of the deployment").trim_start_matches("pod/").to_string();
    let status = r#"{"status":{"phase":"Running","podIP":"10.244.0.7","podIPs":[{"ip":"10.244.0.7"}],"conditions":[{"type":"Ready","status":"True"}]}}"#;
    s.kubectl_ok(&["patch", "pod", &pod, "--subresource=status", "--type=merge", "-p", status]);
    let endpoints = kubectl_until(&s, &["get", "endpoints", "web"], |o| o.contains("10.244.0.7:8080"));
    assert!(endpoints.contains("10.244.0.7:8080"), "{endpoints}");
    let slices = kubectl_until(&s, &["get", "endpointslices", "-l", "kubernetes.io/service-name=web"], |o| {
        o.contains("10.244.0.7")
    });
    for col in ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"] {
        assert!(slices.contains(col), "missing column {col}:\n{slices}");
    }
    assert!(slices.contains("IPv4") && slices.contains("8080") && slices.contains("10.244.0.7"), "{slices}");

    // kubectl apply: unchanged the second time, a changed port configured in place.
    let manifest = "apiVersion: v1\nkind: Service\nmetadata:\n  name: api\nspec:\n  selector:\n    app: api\n  ports:\n  - name: http\n    port: 80\n";
    assert!(stdout(&s.apply(manifest)).contains("service/api created"));
    let ip = s.kubectl_ok(&["get", "service", "api", "-o", "jsonpath={.spec.clusterIP}"]);
    assert!(stdout(&s.apply(manifest)).contains("service/api unchanged"));
    let out = s.apply(&manifest.replace("port: 80", "port: 8080"));
    assert!(stdout(&out).contains("service/api configured"), "{}{}", stdout(&out), stderr(&out));
    let got = s.kubectl_ok(&["get", "service", "api", "-o", "jsonpath={.spec.clusterIP} {.spec.ports[0].port}"]);
    assert_eq!(got, format!("{ip} 8080"));

    s.kubectl_ok(&["delete", "service", "db"]);
    let out = kubectl_until(&s, &["get", "services"], |o| !o.contains("db "));
    assert!(!out.contains("db "), "{out}");
}

#[test]
fn kubectl_auth_can_i_list_and_whoami_answer_for_the_admin_and_for_a_node() {
    let s = Server::start();
    assert_eq!(s.kubectl_ok(&["auth", "can-i", "create", "pods"]).trim(), "yes");
    let whoami = s.kubectl_ok(&["auth", "whoami"]);
    assert!(whoami.contains("Username") && whoami.contains("admin"), "{whoami}");
    assert!(whoami.contains("system:masters"), "{whoami}");
    let list = s.kubectl_ok(&["auth", "can-i", "--list"]);
    assert!(list.lines().any(|l| l.starts_with("*.*") && l.ends_with("[*]")), "{list}");

    // A node's kubeconfig, as `berth server token create` prints it.
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["server", "token", "create", "--node", "node-a", "--data-dir"])
        .arg(s.data_dir())
        .output()
        .expect("running berth server token create");
    assert!(out.status.success(), "{}", stderr(&out));
    let node_kubeconfig = s.dir.path().join("node-a.kubeconfig");
    std::fs::write(&node_kubeconfig, &out.stdout).unwrap();
    let as_node = |args: &[&str]| {
        Command::new("kubectl").env("KUBECONFIG", &node_kubeconfig).args(args).output().expect("running kubectl")
    };
    let can = as_node(&["auth", "can-i", "get", "pods"]);
    assert!(can.status.success() && stdout(&can).trim() == "yes", "{}{}", stdout(&can), stderr(&can));
    let cannot = as_node(&["auth", "can-i", "create", "deployments.apps"]);
    assert!(!cannot.status.success(), "a denied can-i exits non-zero");
    assert_eq!(stdout(&cannot).trim(), "no", "{}", stderr(&cannot));
    let list = as_node(&["auth", "can-i", "--list"]);
    let list = stdout(&list);
    let pods = list.lines().find(|l| l.starts_with("pods ")).unwrap_or_else(|| panic!("no pods rule in:\n{list}"));
    assert!(pods.ends_with("[create delete get list watch]"), "{pods}");
    assert!(!list.contains("deployments.apps"), "{list}");
    let whoami = as_node(&["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"]);
    assert_eq!(stdout(&whoami), "system:node:node-a", "{}", stderr(&whoami));
}

#[test]
fn kubectl_create_token_prints_a_jwt_that_kubectl_can_use() {
    let s = Server::start();
    // Applied rather than created: the ServiceAccount controller may have made it already.
    let out = s.apply("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: default\n");
    assert!(out.status.success(), "{}", stderr(&out));
    let token = s.kubectl_ok(&[
        "create",
        "token",
        "default",
        "--duration",
        "20m",
        "--audience",
        "https://kubernetes.default.svc.cluster.local",
    ]);
    let token = token.trim();
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");
    let out = s.kubectl(&["--token", token, "get", "configmaps", "-o", "name"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let whoami = s.kubectl_ok(&["--token", token, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"]);
    assert_eq!(whoami, "system:serviceaccount:default:default");
    let out = s.kubectl(&["create", "token", "nobody"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("serviceaccounts \"nobody\" not found"), "{}", stderr(&out));
}
