//! End to end: `berth up`, `berth status` and `berth down` as a user runs them, as root, each
//! cluster in a temp data dir with its own API and agent ports, runtime socket and CNI bridge (so
//! it never meets a cluster already running on the machine or another test).
//!
//! - the tour: runtimes proved and their RuntimeClasses made; every file of `examples/` applied
//!   (images replaced by ones from a loopback registry), the pods placed by the scheduler and
//!   Running, logs readable, the pod of an unknown class rejected at admission; `berth status`;
//!   `berth down` and `berth up` again with every container still the same one, never restarted;
//!   `berth down --stop-pods` leaving nothing running;
//! - a runtime that fails its test container is reported with its error and gets no class, and a
//!   worker joins with `berth up --join` and takes half of a Deployment;
//! - preflight lists what is missing (CNI plugins, a port in use) and starts nothing.
//!
//! Needs root, runc, crun (with scripts/fix-crun-hybrid.sh on hybrid cgroup hosts), runsc, the CNI
//! plugins, busybox-static, docker-registry and kubectl.

mod cluster;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use berth_testenv::images::{Format, busybox_image};
use berth_testenv::{Registry, block_on};
use cluster::*;
use serde_json::Value;

#[test]
fn berth_up_runs_the_tour_and_after_down_and_up_every_container_is_the_same_one() {
    let _one = one_cluster_at_a_time();
    let registry = Registry::start();
    let busybox = block_on(registry.push_image("busybox", "1.36", &busybox_image(Format::Oci))).reference;
    let nginx = block_on(registry.push_image("nginx", "1.27", &httpd_image())).reference;
    let cluster = Cluster::new();
    let node = node_name();

    let started = Instant::now();
    let up = cluster.up_ok();
    eprintln!("berth up took {:?}:\n{up}", started.elapsed());
    for handler in ["runc", "crun", "gvisor"] {
        let line = up.lines().find(|l| l.trim_start().starts_with(&format!("{handler} ("))).unwrap_or_default();
        assert!(line.contains("runs a container in"), "{handler} proved: {up}");
    }
    assert!(up.contains("pod overhead"), "gVisor's sandbox weighed: {up}");
    assert!(up.contains(&format!("berth is up: node {node} is Ready")), "{up}");
    assert!(up.contains(&format!("export KUBECONFIG={}", cluster.kubeconfig().display())), "{up}");

    // Again while up: says so, changes nothing.
    let pid = cluster.supervisor_pid().expect("a pidfile");
    let again = cluster.up_ok();
    assert!(again.contains("already up") && again.contains(&pid.to_string()), "{again}");
    assert_eq!(cluster.supervisor_pid(), Some(pid));

    // A class per runtime that works, runc the default, gVisor's with its measured overhead.
    let classes = cluster.json(&["get", "runtimeclasses"]);
    let by_name: BTreeMap<&str, &Value> =
        classes["items"].as_array().unwrap().iter().map(|c| (c["metadata"]["name"].as_str().unwrap(), c)).collect();
    assert_eq!(by_name.keys().copied().collect::<Vec<_>>(), ["crun", "gvisor", "runc"]);
    assert_eq!(by_name["runc"]["metadata"]["annotations"]["runtimeclass.berth.dev/is-default-class"], "true");
    assert!(by_name["crun"]["metadata"]["annotations"].is_null(), "one default only");
    let overhead = by_name["gvisor"]["overhead"]["podFixed"]["memory"].as_str().unwrap();
    assert!(overhead.ends_with("Mi") && overhead != "0Mi", "{overhead}");
    let handlers = cluster.kubectl_ok(&["get", "node", &node, "-o", "jsonpath={.status.runtimeHandlers[*].name}"]);
    for h in ["runc", "crun", "gvisor"] {
        assert!(handlers.split_whitespace().any(|n| n == h), "{h} in the node's runtimeHandlers: {handlers}");
    }

    // Every example; the pod of an unknown class is rejected with the admission message.
    let examples = examples_in(cluster.dir.path(), &busybox, &nginx);
    let applied = cluster.kubectl(&["apply", "-f", &examples.to_string_lossy()]);
    let (out, err) = (text(&applied.stdout), text(&applied.stderr));
    assert!(!applied.status.success(), "{out}");
    assert!(err.contains(r#"pods "hello-unknown" is forbidden: pod rejected: RuntimeClass "kata" not found"#), "{err}");
    assert_eq!(err.lines().filter(|l| l.contains("Error from server")).count(), 1, "only that one fails: {err}");
    for created in [
        "runtimeclass.node.k8s.io/gvisor-sandboxed created",
        "runtimeclass.node.k8s.io/crun-labelled created",
        "deployment.apps/sandboxed-nginx created",
        "pod/hello-runc created",
        "pod/hello-crun created",
        "pod/hello-gvisor created",
        "pod/hello-sandboxed created",
        "pod/hello-default created",
    ] {
        assert!(out.contains(created), "{created}: {out}");
    }
    wait_all_ready(&cluster);
    let rollout = cluster.kubectl(&["rollout", "status", "deployment/sandboxed-nginx", "--timeout=120s"]);
    assert!(rollout.status.success(), "{}", text(&rollout.stderr));

    // Placed by the scheduler (no example names a node), each on its class's runtime.
    let before = containers(&cluster);
    assert_eq!(before.len(), 7, "5 pods and 2 nginx replicas: {before:?}");
    for (pod, (on, ids)) in &before {
        assert_eq!(on, &node, "{pod} placed on the node");
        assert!(ids.iter().all(|(id, restarts)| id.starts_with("berth://") && *restarts == 0), "{pod}: {ids:?}");
    }
    let classes = cluster.kubectl_ok(&[
        "get",
        "pods",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name}={.spec.runtimeClassName}{"\n"}{end}"#,
    ]);
    for expected in ["hello-default=runc", "hello-runc=runc", "hello-crun=crun", "hello-gvisor=gvisor"] {
        assert!(classes.lines().any(|l| l == expected), "{expected}: {classes}");
    }
    let sandboxed = cluster.json(&["get", "pod", "hello-sandboxed"]);
    assert_eq!(sandboxed["spec"]["nodeSelector"]["kubernetes.io/os"], "linux", "the class's nodeSelector merged");
    assert_eq!(sandboxed["spec"]["overhead"]["memory"], "64Mi", "the class's overhead set");
    let sandboxes = berth()
        .args(["cri", "-t", "30s", "-r", &format!("unix://{}", cluster.socket().display()), "pods", "-o", "json"])
        .output()
        .unwrap();
    let sandboxes: Value = serde_json::from_slice(&sandboxes.stdout).unwrap();
    let nginx_handlers: Vec<&str> = sandboxes["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["labels"]["app"] == "sandboxed-nginx")
        .map(|p| p["runtimeHandler"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(nginx_handlers, ["gvisor", "gvisor"], "the seed's Deployment runs under runsc");

    let logs = eventually(Duration::from_secs(30), "kubectl logs hello-runc", || {
        let out = cluster.kubectl_ok(&["logs", "hello-runc"]);
        out.contains("hello from runc").then_some(out)
    });
    assert_eq!(logs.trim(), "hello from runc");
    let gvisor = cluster.kubectl_ok(&["logs", "hello-gvisor"]);
    assert!(gvisor.contains("hello from gVisor") && gvisor.contains("Starting gVisor"), "{gvisor}");

    // berth status: every part running and healthy, the node Ready with its handlers.
    let status = cluster.status();
    let report = text(&status.stdout);
    assert!(status.status.success(), "berth status: {report}{}", text(&status.stderr));
    for part in ["runtime", "server", "agent"] {
        let row = report.lines().find(|l| l.starts_with(part)).unwrap_or_default();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells.get(1), Some(&"running"), "{report}");
        assert!(cells.get(2).and_then(|p| p.parse::<u32>().ok()).is_some(), "a pid: {report}");
        assert!(row.contains(" ok ("), "{part} healthy: {report}");
    }
    assert!(report.contains(&format!("node {node}: Ready; runtimeHandlers: ")), "{report}");
    assert!(report.contains("logs:") && report.contains("agent.log"), "{report}");

    // Down and up again: the same containers, never restarted.
    let down = cluster.down(false);
    assert!(down.status.success(), "berth down: {}{}", text(&down.stderr), text(&down.stdout));
    assert!(!alive(pid), "the supervisor exited");
    assert_eq!(cluster.supervisor_pid(), None, "the pidfile is gone");
    let status = cluster.status();
    assert!(!status.status.success() && text(&status.stdout).contains("berth is down"), "{}", text(&status.stdout));
    assert!(
        !processes_mentioning(&cluster.data_dir().join("runtime").to_string_lossy()).is_empty(),
        "containers run on"
    );

    let up = cluster.up_ok();
    assert!(up.contains(&format!("node {node} is Ready")), "{up}");
    wait_all_ready(&cluster);
    let after = containers(&cluster);
    assert_eq!(after, before, "every pod still there, on the same containers, none restarted");

    // Down, then down with the pods on the stopped cluster: the runtime comes back just to stop
    // them; nothing of them keeps running, and the pod network's bridge goes too.
    let down = cluster.down(false);
    assert!(down.status.success(), "berth down: {}{}", text(&down.stderr), text(&down.stdout));
    let down = cluster.down(true);
    assert!(down.status.success(), "berth down --stop-pods: {}{}", text(&down.stderr), text(&down.stdout));
    assert!(
        text(&down.stdout).contains("berth was down; its runtime stopped and removed 7 pod(s)"),
        "{}",
        text(&down.stdout)
    );
    let left = processes_mentioning(&cluster.data_dir().join("runtime").to_string_lossy());
    assert_eq!(left, Vec::<u32>::new(), "no container monitor left");
    assert!(!cluster.has_sandboxes(), "no sandbox left in the runtime");
    assert!(!Path::new("/sys/class/net").join(&cluster.network.bridge).exists(), "the bridge is gone");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let data_dir = cluster.data_dir().to_string_lossy().into_owned();
    let left: Vec<&str> =
        mounts.lines().filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&data_dir))).collect();
    assert_eq!(left, Vec::<&str>::new(), "no volume of the pods (service account tokens) left mounted");
}

#[test]
fn a_broken_runtime_gets_no_class_and_a_worker_joins_and_takes_half_a_deployment() {
    let _one = one_cluster_at_a_time();
    let registry = Registry::start();
    let busybox = block_on(registry.push_image("busybox", "1.36", &busybox_image(Format::Oci))).reference;

    // A crun that is installed but cannot run anything here.
    let fake = tempfile::tempdir().unwrap();
    let crun = fake.path().join("crun");
    std::fs::write(&crun, "#!/bin/sh\necho \"fake crun: no containers today\" >&2\nexit 1\n").unwrap();
    std::fs::set_permissions(&crun, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut first = Cluster::new();
    first.path_prefix = Some(fake.path().to_path_buf());
    let up = first.up_ok();
    let line = up.lines().find(|l| l.trim_start().starts_with("crun (")).unwrap_or_default();
    assert!(
        line.contains(&format!("crun ({}): cannot run a container here", crun.display()))
            && line.contains("fake crun: no containers today")
            && line.contains("fix: "),
        "{up}"
    );
    let classes = first.kubectl_ok(&["get", "runtimeclasses", "-o", "jsonpath={.items[*].metadata.name}"]);
    assert_eq!(classes, "gvisor runc", "no class for the broken crun");
    let status = text(&first.status().stdout);
    assert!(status.contains("cannot run a container here"), "berth status reports it: {status}");

    // A worker on the same host, with its node's kubeconfig from the first machine.
    let token = berth()
        .args(["server", "token", "create", "--node", "node-b", "--data-dir"])
        .arg(first.data_dir())
        .output()
        .unwrap();
    assert!(token.status.success(), "{}", text(&token.stderr));
    let join = first.dir.path().join("node-b.kubeconfig");
    std::fs::write(&join, &token.stdout).unwrap();
    let worker = Cluster::worker(&join);
    let up = worker.up_ok();
    assert!(up.contains("berth is up: node node-b is Ready and joined the cluster at https://127.0.0.1:"), "{up}");
    let nodes = first.kubectl_ok(&[
        "get",
        "nodes",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#,
    ]);
    let node = node_name();
    assert_eq!(nodes.lines().count(), 2, "{nodes}");
    assert!(nodes.lines().any(|l| l == format!("{node}=True")) && nodes.lines().any(|l| l == "node-b=True"), "{nodes}");
    let status = worker.status();
    let report = text(&status.stdout);
    assert!(status.status.success(), "{report}");
    assert!(report.contains("a worker") && !report.lines().any(|l| l.starts_with("server")), "{report}");

    let deployment = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "spread"},
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": {"app": "spread"}},
            "template": {
                "metadata": {"labels": {"app": "spread"}},
                "spec": {
                    "topologySpreadConstraints": [{
                        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": {"matchLabels": {"app": "spread"}}
                    }],
                    "containers": [{"name": "app", "image": busybox,
                                    "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]}]
                }
            }
        }
    });
    let file = first.dir.path().join("spread.json");
    std::fs::write(&file, deployment.to_string()).unwrap();
    first.kubectl_ok(&["apply", "-f", &file.to_string_lossy()]);
    let rollout = first.kubectl(&["rollout", "status", "deployment/spread", "--timeout=240s"]);
    assert!(rollout.status.success(), "{}\n{}", text(&rollout.stderr), worker.logs());
    let placed = containers(&first);
    let on = |n: &str| placed.values().filter(|(node, _)| node == n).count();
    assert_eq!((on(&node), on("node-b")), (2, 2), "{placed:?}");

    let down = worker.down(true);
    assert!(down.status.success(), "{}", text(&down.stderr));
    assert!(!worker.has_sandboxes());
}

#[test]
fn preflight_lists_every_missing_thing_with_its_fix_and_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let no_cni = dir.path().join("no-cni");
    let data_dir = dir.path().join("d");
    let out = berth()
        .arg("up")
        .arg("--data-dir")
        .arg(&data_dir)
        .args(["--secure-port", &port.to_string(), "--agent-port", &free_port().to_string(), "--runtime-socket"])
        .arg(dir.path().join("run/runtime.sock"))
        .arg("--cni-bin-dir")
        .arg(&no_cni)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with("berth up: this machine is not ready (2 to fix):\n"), "{err}");
    assert!(
        err.contains(&format!(
            "  - missing CNI plugins in {}: bridge, host-local, loopback, portmap (install Debian's \
             containernetworking-plugins: apt-get install containernetworking-plugins)\n",
            no_cni.display()
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "  - port {port} (the API server's) is already in use: stop what listens there (ss -ltnp 'sport = \
             :{port}' shows it), or pass --secure-port PORT\n"
        )),
        "{err}"
    );
    assert!(!data_dir.join("up.pid").exists() && !data_dir.join("runtime/runtime.toml").exists(), "nothing started");
}
