//! One agent, two CRI runtimes at once: the real `berth runtime` and Debian's containerd 1.6
//! (CRI plugin, runc), both started by the test, with the real `berth server`, the real `berth
//! agent` binary as the node (a `berth server token create` kubeconfig) and the real kubectl.
//! A pod pinned to containerd by annotation or routed there by its RuntimeClass runs there, next
//! to pods on berth; and after `kill -9` of the agent, with pods deleted and created meanwhile, a
//! restarted agent leaves exactly the expected sandboxes on each runtime.
//!
//! Needs root, runc, containerd, the CNI plugins, busybox-static, docker-registry and kubectl.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use berth_testenv::images::{Format, busybox_symlinked_image};
use berth_testenv::{Containerd, Registry};
use common::{Agent, Runtime, Server, condition, eventually, eventually_within, runtime_handlers};
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::json;

const NODE: &str = "node-two";
/// The handler only containerd serves (runc again, under another name).
const CONTAINERD_ONLY: &str = "ctd-runc";
/// Creating, restarting and deleting 30 pods in a debug build on 2 busy cores.
const PODS_PATIENCE: Duration = Duration::from_secs(180);

/// Server, berth runtime, containerd and the agent driving both, images from a loopback registry.
struct Node {
    // Dropped in this order: the agent first, then the runtimes (which remove what is left).
    agent: Agent,
    containerd: Containerd,
    berth: Runtime,
    server: Server,
    image: String,
    _registry: Registry,
    _dir: tempfile::TempDir,
}

impl Node {
    async fn start() -> Node {
        let registry = Registry::start();
        registry.push_pause().await;
        let busybox = tokio::task::spawn_blocking(|| busybox_symlinked_image(Format::Oci)).await.unwrap();
        let image = registry.push_image("busybox", "1.0", &busybox).await.reference;
        let host = registry.host().to_owned();
        let (server, berth, containerd) = tokio::task::spawn_blocking(move || {
            let containerd = Containerd::builder().registry(&host).handler(CONTAINERD_ONLY, "runc").start();
            (Server::start(), Runtime::builder().insecure_registry(&host).start(), containerd)
        })
        .await
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = common::node_kubeconfig(&server, NODE, dir.path());
        let config = common::agent_toml(&[("berth", &berth)], false)
            + &common::containerd_endpoint_toml("containerd", &containerd);
        let agent = Agent::start_as(NODE, &config, &kubeconfig);
        let node = Node { agent, containerd, berth, server, image, _registry: registry, _dir: dir };
        node.apply(json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                          "metadata": {"name": CONTAINERD_ONLY}, "handler": CONTAINERD_ONLY}));
        node
    }

    fn apply(&self, manifest: serde_json::Value) {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), manifest.to_string()).unwrap();
        self.server.kubectl_ok(&["apply", "-f", &file.path().to_string_lossy()]);
    }

    /// A pod of `busybox` that prints a line and sleeps, and ends at once on SIGTERM.
    fn create_pod(&self, name: &str, place: Place) {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "nodeName": NODE,
                "terminationGracePeriodSeconds": 2,
                "containers": [{"name": "app", "image": self.image, "command": ["sh", "-c",
                    format!("echo hello from {name}; trap 'exit 0' TERM; sleep 3600 & wait")]}]
            }
        });
        match place {
            Place::Default => {}
            Place::Pinned => pod["metadata"]["annotations"] = json!({"runtime.berth.dev/service": "containerd"}),
            Place::Routed => pod["spec"]["runtimeClassName"] = CONTAINERD_ONLY.into(),
        }
        self.apply(pod);
    }

    async fn pods(&self) -> Vec<Pod> {
        Api::<Pod>::namespaced(self.server.client().await, "default").list(&ListParams::default()).await.unwrap().items
    }

    /// Waits until the pods of `expected` (and no others) exist and all run.
    async fn wait_running(&self, expected: &BTreeSet<String>) -> BTreeMap<String, Pod> {
        let what = format!("exactly {} pods running: {expected:?}", expected.len());
        eventually_within(PODS_PATIENCE, &what, || async {
            let pods: BTreeMap<String, Pod> =
                self.pods().await.into_iter().map(|p| (p.metadata.name.clone().unwrap(), p)).collect();
            let names: BTreeSet<String> = pods.keys().cloned().collect();
            (names == *expected && pods.values().all(running)).then_some(pods)
        })
        .await
    }

    /// Deletes every pod gracefully through the agent and waits until both runtimes are empty.
    async fn delete_all_pods(&self) {
        self.server.kubectl_ok(&["delete", "pods", "--all", "--timeout=120s"]);
        for (name, endpoint) in [("berth", self.berth.endpoint()), ("containerd", self.containerd.endpoint())] {
            eventually(&format!("{name} to hold no sandbox"), || async {
                let (sandboxes, containers) = inventory(&endpoint).await;
                (sandboxes.is_empty() && containers.is_empty()).then_some(())
            })
            .await;
        }
    }
}

impl Drop for Node {
    /// The harness prints the logs of server, runtime and agent when a test fails; this adds containerd's.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- containerd log ({}) ---\n{}", self.containerd.dir().display(), self.containerd.log_tail(60));
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Place {
    /// No class, no pin: the default handler of the first endpoint, berth.
    Default,
    /// `runtime.berth.dev/service: containerd`.
    Pinned,
    /// RuntimeClass `ctd-runc`, served by containerd only.
    Routed,
}

fn running(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    pod.metadata.deletion_timestamp.is_none()
        && status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn container_id(pod: &Pod) -> String {
    pod.status.as_ref().unwrap().container_statuses.as_ref().unwrap()[0].container_id.clone().unwrap_or_default()
}

fn restart_count(pod: &Pod) -> i32 {
    pod.status.as_ref().unwrap().container_statuses.as_ref().unwrap()[0].restart_count
}

fn pod_ip(pod: &Pod) -> String {
    pod.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default()
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap()
}

/// Every sandbox and container a runtime holds, straight from CRI.
async fn inventory(endpoint: &str) -> (Vec<cri::PodSandbox>, Vec<cri::Container>) {
    let mut client = common::cri_client(endpoint);
    let sandboxes = client.list_pod_sandbox(cri::ListPodSandboxRequest::default()).await.unwrap().into_inner().items;
    let containers =
        client.list_containers(cri::ListContainersRequest::default()).await.unwrap().into_inner().containers;
    (sandboxes, containers)
}

fn pod_uid_label(labels: &std::collections::HashMap<String, String>) -> String {
    labels.get("io.kubernetes.pod.uid").cloned().unwrap_or_default()
}

/// Whether a runtime holds exactly one ready sandbox and one running container for each UID of
/// `expected`, and nothing else; else what differs.
async fn holds_exactly(endpoint: &str, expected: &BTreeSet<String>) -> Result<(), String> {
    let (sandboxes, containers) = inventory(endpoint).await;
    let mut problems = Vec::new();
    for uid in expected {
        let mine: Vec<_> = sandboxes.iter().filter(|s| pod_uid_label(&s.labels) == *uid).collect();
        let ready = mine.iter().filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32).count();
        if mine.len() != 1 || ready != 1 {
            problems.push(format!("pod {uid}: {} sandboxes, {ready} ready", mine.len()));
        }
        let running = containers
            .iter()
            .filter(|c| pod_uid_label(&c.labels) == *uid && c.state == cri::ContainerState::ContainerRunning as i32)
            .count();
        let all = containers.iter().filter(|c| pod_uid_label(&c.labels) == *uid).count();
        if all != 1 || running != 1 {
            problems.push(format!("pod {uid}: {all} containers, {running} running"));
        }
    }
    for s in sandboxes.iter().filter(|s| !expected.contains(&pod_uid_label(&s.labels))) {
        problems.push(format!("unexpected sandbox {} of pod {:?}", s.id, s.metadata.as_ref().map(|m| &m.name)));
    }
    for c in containers.iter().filter(|c| !expected.contains(&pod_uid_label(&c.labels))) {
        problems.push(format!("unexpected container {} ({:?})", c.id, c.labels.get("io.kubernetes.pod.name")));
    }
    if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
}

/// Waits until `endpoint` holds exactly the sandboxes of `expected`.
async fn wait_holds_exactly(name: &str, endpoint: &str, expected: &BTreeSet<String>) {
    let mut last = String::new();
    let result = tokio::time::timeout(PODS_PATIENCE, async {
        loop {
            match holds_exactly(endpoint, expected).await {
                Ok(()) => return,
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await;
    assert!(result.is_ok(), "{name} does not hold exactly the expected sandboxes: {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agent_runs_pods_on_berth_and_on_containerd_pinned_or_routed_by_runtime_class() {
    let node = Node::start().await;
    let ready = eventually("the node Ready with both runtimes", || async {
        node.server.node(NODE).await.filter(|n| {
            ["Ready", "RuntimeReady.berth.dev/berth", "RuntimeReady.berth.dev/containerd"]
                .iter()
                .all(|kind| condition(n, kind).is_some_and(|c| c.status == "True"))
        })
    })
    .await;
    let versions = ready.status.as_ref().unwrap().node_info.as_ref().unwrap().container_runtime_version.clone();
    let (berth_version, containerd_version) = versions.split_once(", ").expect("two runtime versions");
    assert_eq!(berth_version, "berth://0.1.0");
    assert!(containerd_version.starts_with("containerd://1.6."), "{versions}");
    let handlers = runtime_handlers(&ready);
    for h in ["", "runc", "crun", "gvisor", CONTAINERD_ONLY] {
        assert!(handlers.contains(&h.to_string()), "{h:?} in {handlers:?}");
    }

    node.create_pod("on-berth", Place::Default);
    node.create_pod("pinned", Place::Pinned);
    node.create_pod("routed", Place::Routed);
    let names: BTreeSet<String> = ["on-berth", "pinned", "routed"].map(String::from).into();
    let pods = node.wait_running(&names).await;

    let subnet = &node.containerd.network().subnet;
    let containerd_prefix = subnet.trim_end_matches("0/24");
    assert!(container_id(&pods["on-berth"]).starts_with("berth://"), "{}", container_id(&pods["on-berth"]));
    assert!(!pod_ip(&pods["on-berth"]).starts_with(containerd_prefix), "on-berth's IP is berth's");
    for name in ["pinned", "routed"] {
        let pod = &pods[name];
        assert!(container_id(pod).starts_with("containerd://"), "{name}: {}", container_id(pod));
        assert!(pod_ip(pod).starts_with(containerd_prefix), "{name}'s IP {} in containerd's {subnet}", pod_ip(pod));
    }
    let (sandboxes, _) = inventory(&node.containerd.endpoint()).await;
    let handler_of = |name: &str| {
        sandboxes
            .iter()
            .find(|s| pod_uid_label(&s.labels) == uid(&pods[name]))
            .map(|s| s.runtime_handler.clone())
            .unwrap_or_else(|| panic!("no containerd sandbox for {name}"))
    };
    assert_eq!(handler_of("pinned"), "", "the pinned pod runs containerd's default handler");
    assert_eq!(handler_of("routed"), CONTAINERD_ONLY);
    wait_holds_exactly("berth", &node.berth.endpoint(), &[uid(&pods["on-berth"])].into()).await;
    let on_containerd = [uid(&pods["pinned"]), uid(&pods["routed"])].into();
    wait_holds_exactly("containerd", &node.containerd.endpoint(), &on_containerd).await;

    for name in ["pinned", "routed"] {
        let logs = eventually(&format!("kubectl logs {name}"), || async {
            let out = node.server.kubectl_ok(&["logs", name]);
            out.contains("hello").then_some(out)
        })
        .await;
        assert_eq!(logs.trim(), format!("hello from {name}"));
    }
    assert_eq!(node.server.kubectl_ok(&["exec", "pinned", "--", "cat", "/etc/hostname"]).trim(), "pinned");
    assert_eq!(node.server.kubectl_ok(&["exec", "routed", "--", "hostname"]).trim(), "routed");
    let failed = node.server.kubectl(&["exec", "routed", "--", "sh", "-c", "exit 3"]);
    assert_eq!(failed.status.code(), Some(3), "exec's exit code comes back from containerd");

    node.delete_all_pods().await;
    assert!(node.pods().await.is_empty(), "every pod is gone from the API");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_the_restarted_agent_leaves_exactly_the_expected_sandboxes_on_both_runtimes() {
    let mut node = Node::start().await;
    let berth_pods: Vec<String> = (0..20).map(|i| format!("b-{i}")).collect();
    let containerd_pods: Vec<String> = (0..10).map(|i| format!("c-{i}")).collect();
    for name in &berth_pods {
        node.create_pod(name, Place::Default);
    }
    for (i, name) in containerd_pods.iter().enumerate() {
        node.create_pod(name, if i % 2 == 0 { Place::Pinned } else { Place::Routed });
    }
    let mut expected: BTreeSet<String> = berth_pods.iter().chain(&containerd_pods).cloned().collect();
    let before = node.wait_running(&expected).await;

    let agent_pid = node.agent.pid().expect("the agent runs");
    node.agent.kill9();
    assert!(!std::path::Path::new(&format!("/proc/{agent_pid}")).exists(), "the agent process itself is gone");
    // While the agent is down: graceful deletes (the pods wait for the node with a
    // deletionTimestamp), force deletes (the pods vanish; their sandboxes are orphans), and new pods.
    node.server.kubectl_ok(&["delete", "pod", "b-0", "b-1", "c-0", "c-1", "--wait=false"]);
    node.server.kubectl_ok(&["delete", "pod", "b-2", "c-3", "--grace-period=0", "--force"]);
    for gone in ["b-0", "b-1", "b-2", "c-0", "c-1", "c-3"] {
        expected.remove(gone);
    }
    let waiting = node.pods().await;
    for name in ["b-0", "c-1"] {
        let pod = waiting.iter().find(|p| p.metadata.name.as_deref() == Some(name));
        assert!(
            pod.is_some_and(|p| p.metadata.deletion_timestamp.is_some()),
            "{name} waits for its node with a deletionTimestamp"
        );
    }
    for (name, place) in [("b-new-0", Place::Default), ("b-new-1", Place::Default)]
        .into_iter()
        .chain([("c-new-0", Place::Pinned), ("c-new-1", Place::Routed)])
    {
        node.create_pod(name, place);
        expected.insert(name.to_string());
    }
    node.agent.restart();

    let after = node.wait_running(&expected).await;
    for (name, pod) in &after {
        assert_eq!(restart_count(pod), 0, "{name} was not restarted");
        if let Some(old) = before.get(name) {
            assert_eq!(uid(pod), uid(old), "{name} is the same pod");
            assert_eq!(container_id(pod), container_id(old), "{name} kept its container");
        }
        let runtime = if name.starts_with("b-") { "berth://" } else { "containerd://" };
        assert!(container_id(pod).starts_with(runtime), "{name}: {}", container_id(pod));
    }
    let uids_of = |prefix: &str| -> BTreeSet<String> {
        after.iter().filter(|(name, _)| name.starts_with(prefix)).map(|(_, p)| uid(p)).collect()
    };
    assert_eq!(uids_of("b-").len() + uids_of("c-").len(), 28);
    wait_holds_exactly("berth", &node.berth.endpoint(), &uids_of("b-")).await;
    wait_holds_exactly("containerd", &node.containerd.endpoint(), &uids_of("c-")).await;
    node.agent.check_alive();

    node.delete_all_pods().await;
    assert!(node.pods().await.is_empty(), "every pod is gone from the API");
}
