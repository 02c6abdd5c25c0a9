//! Pods without a node, end to end: a real `berth server` (its scheduler in-process, or
//! `--no-scheduler` with `berth scheduler` processes beside it), a real `berth runtime`, the real
//! `berth agent` and the real kubectl. `kubectl run` pods are placed and run; a pod no node can
//! take is explained by `kubectl describe`; with two standalone schedulers one holds the Lease,
//! and when it is killed the other places the pods created afterwards.
//!
//! Needs root, runc, runsc, the CNI plugins, busybox-static, docker-registry and kubectl.

mod common;

use std::time::{Duration, Instant};

use berth_testenv::Registry;
use berth_testenv::images::{Format, busybox_image};
use common::{Agent, ControlPart, Runtime, Server, agent_toml, condition, eventually, eventually_within};

const NODE: &str = "node-sched";

async fn node_ready(server: &Server) {
    eventually("the node Ready", || async {
        server.node(NODE).await.filter(|n| condition(n, "Ready").is_some_and(|c| c.status == "True"))
    })
    .await;
}

fn apply(server: &Server, manifest: serde_json::Value) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), manifest.to_string()).unwrap();
    server.kubectl_ok(&["apply", "-f", &file.path().to_string_lossy()]);
}

/// `kubectl run NAME --image IMAGE -- sleep 3600`, then waits for it to be Ready.
fn run_and_wait(server: &Server, agent: &Agent, name: &str, image: &str) {
    server.kubectl_ok(&["run", name, "--image", image, "--restart=Never", "--", "sleep", "3600"]);
    let ready = server.kubectl(&["wait", "--for=condition=Ready", &format!("pod/{name}"), "--timeout=120s"]);
    assert!(
        ready.status.success(),
        "pod {name} Ready: {}\n{}\nagent log:\n{}",
        String::from_utf8_lossy(&ready.stderr),
        server.kubectl_ok(&["describe", "pod", name]),
        agent.log()
    );
    let node = server.kubectl_ok(&["get", "pod", name, "-o", "jsonpath={.spec.nodeName}"]);
    assert_eq!(node, NODE, "the scheduler bound {name} to the only node");
}

/// The messages of the events of `reason` about pod `name`.
fn events(server: &Server, name: &str, reason: &str) -> Vec<String> {
    let out = server.kubectl_ok(&[
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={name},reason={reason}"),
        "-o",
        "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    ]);
    out.lines().map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_run_pods_are_placed_and_run_and_describe_explains_a_pod_no_node_can_take() {
    let registry = Registry::start();
    let image = registry.push_image("busybox", "1.0", &busybox_image(Format::Oci)).await.reference;
    let server = Server::start();
    let runtime = Runtime::builder().insecure_registry(registry.host()).start();
    let agent = Agent::start(&server, NODE, &agent_toml(&[("berth", &runtime)], false));
    node_ready(&server).await;

    run_and_wait(&server, &agent, "web", &image);
    let scheduled = events(&server, "web", "Scheduled");
    assert_eq!(scheduled, vec![format!("Successfully assigned default/web to {NODE}")]);

    // A class whose handler no node runs, and a pod of it.
    apply(
        &server,
        serde_json::json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "kata"}, "handler": "kata"}),
    );
    apply(
        &server,
        serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sandboxed-nginx"},
            "spec": {"runtimeClassName": "kata", "containers": [{"name": "app", "image": image}]}}),
    );
    let expected = "0/1 nodes are available: 1 node(s) didn't support RuntimeClass \"kata\".";
    let described = eventually("the FailedScheduling event", || async {
        let out = server.kubectl_ok(&["describe", "pod", "sandboxed-nginx"]);
        out.contains("FailedScheduling").then_some(out)
    })
    .await;
    let line = described.lines().find(|l| l.contains("FailedScheduling")).unwrap();
    assert!(line.trim_start().starts_with("Warning"), "{line}");
    assert!(line.contains("default-scheduler"), "{line}");
    assert!(line.trim_end().ends_with(expected), "{line}");
    let condition = server.kubectl_ok(&[
        "get",
        "pod",
        "sandboxed-nginx",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].reason}: {.status.conditions[?(@.type==\"PodScheduled\")].message}",
    ]);
    assert_eq!(condition, format!("Unschedulable: {expected}"));

    // More memory than the node has.
    apply(
        &server,
        serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "huge"},
            "spec": {"containers": [{"name": "app", "image": image, "resources": {"requests": {"memory": "100Ti"}}}]}}),
    );
    let messages = eventually("huge's FailedScheduling event", || async {
        let m = events(&server, "huge", "FailedScheduling");
        (!m.is_empty()).then_some(m)
    })
    .await;
    assert_eq!(messages[0], "0/1 nodes are available: 1 Insufficient memory.");
    server.kubectl_ok(&["delete", "pod", "web", "sandboxed-nginx", "huge", "--timeout=60s"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_scheduler_places_pods_and_its_standby_takes_over_when_it_is_killed() {
    let registry = Registry::start();
    let image = registry.push_image("busybox", "1.0", &busybox_image(Format::Oci)).await.reference;
    let server = Server::start_with(&["--no-scheduler"]);
    let runtime = Runtime::builder().insecure_registry(registry.host()).start();
    let agent = Agent::start(&server, NODE, &agent_toml(&[("berth", &runtime)], false));
    node_ready(&server).await;

    // Without a scheduler, a pod stays unplaced.
    server.kubectl_ok(&["run", "waiting", "--image", &image, "--restart=Never", "--", "sleep", "3600"]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(server.kubectl_ok(&["get", "pod", "waiting", "-o", "jsonpath={.spec.nodeName}"]), "");

    let mut schedulers = [ControlPart::scheduler(&server), ControlPart::scheduler(&server)];
    let leader = eventually("one scheduler holding the lease", || async {
        let leading: Vec<usize> = (0..2).filter(|&i| schedulers[i].log().contains("acquired leadership")).collect();
        (leading.len() == 1).then(|| leading[0])
    })
    .await;
    let holder = server.kubectl_ok(&[
        "get",
        "lease",
        "-n",
        "kube-system",
        "kube-scheduler",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    assert!(!holder.is_empty());
    let ready = server.kubectl(&["wait", "--for=condition=Ready", "pod/waiting", "--timeout=120s"]);
    assert!(ready.status.success(), "{}\n{}", String::from_utf8_lossy(&ready.stderr), agent.log());
    run_and_wait(&server, &agent, "first", &image);
    for pod in ["waiting", "first"] {
        assert_eq!(events(&server, pod, "Scheduled").len(), 1, "{pod} was bound once");
    }
    let standby = 1 - leader;
    assert!(!schedulers[standby].log().contains("acquired leadership"), "only one leads at a time");

    schedulers[leader].kill9();
    let killed = Instant::now();
    server.kubectl_ok(&["run", "after", "--image", &image, "--restart=Never", "--", "sleep", "3600"]);
    eventually_within(Duration::from_secs(20), "the standby binding the pod made after the kill", || async {
        let node = server.kubectl_ok(&["get", "pod", "after", "-o", "jsonpath={.spec.nodeName}"]);
        (node == NODE).then_some(())
    })
    .await;
    eprintln!("the standby bound a new pod {:?} after the leader was killed", killed.elapsed());
    assert!(schedulers[standby].log().contains("acquired leadership"));
    let ready = server.kubectl(&["wait", "--for=condition=Ready", "pod/after", "--timeout=120s"]);
    assert!(ready.status.success(), "{}", String::from_utf8_lossy(&ready.stderr));
    assert_eq!(events(&server, "after", "Scheduled").len(), 1);
    server.kubectl_ok(&["delete", "pod", "waiting", "first", "after", "--timeout=60s"]);
}
