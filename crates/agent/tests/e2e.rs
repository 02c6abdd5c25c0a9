//! The whole node through its interfaces: a real `berth server`, a real `berth runtime` (runc
//! and gVisor handlers, images from a loopback registry), the real `berth agent` binary running
//! as the node (a `berth server token create` kubeconfig, so NodeRestriction applies), and the
//! real kubectl: pods of both classes reach Running, `kubectl logs` and `kubectl exec` reach them
//! through the server's proxy and the agent's API, and deletion is graceful.
//!
//! Needs root, runc, runsc, the CNI plugins, busybox-static, docker-registry and kubectl.

mod common;

use berth_testenv::Registry;
use berth_testenv::images::{Format, busybox_image};
use common::{Agent, Runtime, Server, agent_toml, condition, eventually};

const NODE: &str = "node-e2e";

fn apply(server: &Server, manifest: serde_json::Value) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), manifest.to_string()).unwrap();
    server.kubectl_ok(&["apply", "-f", &file.path().to_string_lossy()]);
}

fn pod(name: &str, class: Option<&str>, image: &str, script: &str) -> serde_json::Value {
    let mut spec = serde_json::json!({
        "nodeName": NODE,
        "terminationGracePeriodSeconds": 5,
        "containers": [{"name": "app", "image": image, "command": ["sh", "-c", script]}]
    });
    if let Some(class) = class {
        spec["runtimeClassName"] = class.into();
    }
    serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_runs_pods_of_every_class_reads_their_logs_execs_into_them_and_deletes_them_gracefully() {
    let registry = Registry::start();
    let image = registry.push_image("busybox", "1.0", &busybox_image(Format::Oci)).await.reference;
    let server = Server::start();
    let runtime = Runtime::builder().insecure_registry(registry.host()).start();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = common::node_kubeconfig(&server, NODE, dir.path());
    let agent = Agent::start_as(NODE, &agent_toml(&[("berth", &runtime)], false), &kubeconfig);
    eventually("the node Ready", || async {
        server.node(NODE).await.filter(|n| condition(n, "Ready").is_some_and(|c| c.status == "True"))
    })
    .await;

    apply(
        &server,
        serde_json::json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "gvisor"}, "handler": "gvisor"}),
    );
    apply(&server, pod("web", None, &image, "echo hello from web; exec sleep 3600"));
    apply(&server, pod("sandboxed", Some("gvisor"), &image, "dmesg; exec sleep 3600"));
    let ready = server.kubectl(&["wait", "--for=condition=Ready", "pod/web", "pod/sandboxed", "--timeout=180s"]);
    assert!(
        ready.status.success(),
        "pods Ready: {}\nagent log:\n{}",
        String::from_utf8_lossy(&ready.stderr),
        agent.log()
    );

    let ids = server.kubectl_ok(&[
        "get",
        "pods",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}={.status.containerStatuses[0].containerID} {end}",
    ]);
    assert!(ids.contains("web=berth://") && ids.contains("sandboxed=berth://"), "{ids}");

    let logs = eventually("kubectl logs web", || async {
        let out = server.kubectl_ok(&["logs", "web"]);
        out.contains("hello from web").then_some(out)
    })
    .await;
    assert_eq!(logs.trim(), "hello from web");
    let banner = server.kubectl_ok(&["logs", "sandboxed"]);
    assert!(banner.contains("Starting gVisor"), "the gVisor pod really runs under runsc: {banner}");

    assert_eq!(server.kubectl_ok(&["exec", "web", "--", "cat", "/etc/hostname"]).trim(), "web");
    let uname = server.kubectl_ok(&["exec", "sandboxed", "--", "dmesg"]);
    assert!(uname.contains("gVisor"), "exec runs inside the gVisor sandbox: {uname}");
    let failed = server.kubectl(&["exec", "web", "--", "sh", "-c", "exit 3"]);
    assert_eq!(failed.status.code(), Some(3), "exec's exit code reaches kubectl");

    let deleted = server.kubectl(&["delete", "pod", "web", "sandboxed", "--timeout=60s"]);
    assert!(deleted.status.success(), "graceful delete: {}", String::from_utf8_lossy(&deleted.stderr));
    let left = server.kubectl_ok(&["get", "pods", "-o", "name"]);
    assert_eq!(left.trim(), "", "both pods are gone");
    let sandboxes = runtime.cri(&["pods", "-q"]);
    assert_eq!(String::from_utf8_lossy(&sandboxes.stdout).trim(), "", "no sandbox is left in the runtime");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_waits_for_a_runtime_that_is_down_instead_of_starting_its_pods_twice() {
    let registry = Registry::start();
    let image = registry.push_image("busybox", "1.0", &busybox_image(Format::Oci)).await.reference;
    let server = Server::start();
    let mut first = Runtime::builder().insecure_registry(registry.host()).start();
    let second = Runtime::builder().insecure_registry(registry.host()).start();
    // `first` is the default endpoint: a pod without a RuntimeClass runs there.
    let mut agent = Agent::start(&server, NODE, &agent_toml(&[("first", &first), ("second", &second)], false));
    apply(&server, pod("kept", None, &image, "exec sleep 3600"));
    let ready = server.kubectl(&["wait", "--for=condition=Ready", "pod/kept", "--timeout=120s"]);
    assert!(ready.status.success(), "pod Ready: {}\n{}", String::from_utf8_lossy(&ready.stderr), agent.log());
    let uid = server.kubectl_ok(&["get", "pod", "kept", "-o", "jsonpath={.metadata.uid}"]);
    assert_eq!(first.sandboxes_of(&uid).len(), 1);

    // The agent dies, and its pod's runtime is down when it comes back; `second` is ready and
    // now the default, and serves the pod's handler too.
    agent.kill9();
    first.stop();
    agent.write_config(&agent_toml(&[("second", &second), ("first", &first)], true));
    agent.restart();
    tokio::time::sleep(std::time::Duration::from_secs(8)).await;
    assert_eq!(second.sandboxes_of(&uid), Vec::<String>::new(), "not started on the other runtime:\n{}", agent.log());

    // Deleting it meanwhile waits for the runtime that holds it.
    let deleting = server.kubectl(&["delete", "pod", "kept", "--wait=false"]);
    assert!(deleting.status.success(), "{}", String::from_utf8_lossy(&deleting.stderr));
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    assert_eq!(second.sandboxes_of(&uid), Vec::<String>::new(), "not started on the other runtime:\n{}", agent.log());
    let left = server.kubectl_ok(&["get", "pods", "-o", "name"]);
    assert_eq!(left.trim(), "pod/kept", "still there while its containers may run");
    first.restart();
    eventually("the pod stopped on its runtime and gone from the API", || async {
        let left = server.kubectl_ok(&["get", "pods", "-o", "name"]);
        left.trim().is_empty().then_some(())
    })
    .await;
    assert_eq!(first.sandboxes_of(&uid), Vec::<String>::new(), "torn down where it ran");
    assert_eq!(second.sandboxes_of(&uid), Vec::<String>::new(), "never started elsewhere:\n{}", agent.log());
}
