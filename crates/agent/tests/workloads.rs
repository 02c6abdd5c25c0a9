//! Workloads end to end: a real `berth server` (scheduler and controllers in-process, or
//! `--controllers=-*` with `berth controller-manager` beside it), real `berth runtime`s, real
//! `berth agent`s and the real kubectl. The RuntimeClass seed's sandboxed Deployment runs under
//! gVisor, scales, rolls out within its surge and unavailability bounds (watched from outside),
//! is undone and deleted with everything it owns; a node whose agent dies is tainted and its
//! pods come back on the other node; a server killed mid-rollout finishes it after a restart.
//!
//! Needs root, runc, runsc, the CNI plugins, busybox-static, docker-registry and kubectl.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_testenv::Registry;
use berth_testenv::images::{Format, busybox_image};
use common::{Agent, ControlPart, Runtime, Server, agent_toml, condition, eventually, eventually_within};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::watcher;

const NODE: &str = "node-work";

fn apply(server: &Server, manifest: serde_json::Value) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), manifest.to_string()).unwrap();
    server.kubectl_ok(&["apply", "-f", &file.path().to_string_lossy()]);
}

async fn node_ready(server: &Server, node: &str) {
    eventually("the node Ready", || async {
        server.node(node).await.filter(|n| condition(n, "Ready").is_some_and(|c| c.status == "True"))
    })
    .await;
}

/// The seed's Deployment: `replicas` pods of `image` under `class` (no class: the default).
fn deployment(
    name: &str,
    replicas: i32,
    class: Option<&str>,
    image: &str,
    extra_spec: serde_json::Value,
) -> serde_json::Value {
    let mut pod_spec = serde_json::json!({
        "terminationGracePeriodSeconds": 2,
        "containers": [{"name": "nginx", "image": image, "command": ["sleep", "3600"]}]
    });
    if let Some(class) = class {
        pod_spec["runtimeClassName"] = class.into();
    }
    if let Some(extra) = extra_spec.as_object() {
        for (k, v) in extra {
            pod_spec[k] = v.clone();
        }
    }
    serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec}
        }
    })
}

fn rollout_status(server: &Server, name: &str) {
    let out = server.kubectl(&["rollout", "status", &format!("deployment/{name}"), "--timeout=240s"]);
    assert!(
        out.status.success(),
        "rollout of {name}: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        server.kubectl_ok(&["get", "deploy,rs,pods", "-o", "wide"])
    );
}

/// Non-terminating pods of `app` and how many of them are Ready.
fn counts(pods: &BTreeMap<String, Pod>) -> (usize, usize) {
    let live: Vec<&Pod> = pods.values().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
    let ready = live
        .iter()
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count();
    (live.len(), ready)
}

/// Watches the pods of `app` from outside and records the extremes: the most pods alive at once
/// and the fewest Ready ones, from the moment `armed` is set.
struct PodWatch {
    extremes: Arc<Mutex<(usize, usize)>>,
    armed: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl PodWatch {
    fn start(client: kube::Client, app: &str) -> PodWatch {
        let api: Api<Pod> = Api::default_namespaced(client);
        let extremes = Arc::new(Mutex::new((0usize, usize::MAX)));
        let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (ex, on) = (extremes.clone(), armed.clone());
        let config = watcher::Config::default().labels(&format!("app={app}"));
        let task = tokio::spawn(async move {
            let mut pods = BTreeMap::new();
            let mut stream = watcher(api, config).boxed();
            while let Some(Ok(event)) = stream.next().await {
                match event {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                        pods.insert(p.metadata.name.clone().unwrap_or_default(), p);
                    }
                    watcher::Event::Delete(p) => {
                        pods.remove(&p.metadata.name.clone().unwrap_or_default());
                    }
                    _ => {}
                }
                if on.load(std::sync::atomic::Ordering::SeqCst) {
                    let (live, ready) = counts(&pods);
                    let mut e = ex.lock().unwrap();
                    e.0 = e.0.max(live);
                    e.1 = e.1.min(ready);
                }
            }
        });
        PodWatch { extremes, armed, task }
    }

    fn arm(&self) {
        self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// (most pods alive at once, fewest Ready) since armed.
    fn extremes(&self) -> (usize, usize) {
        *self.extremes.lock().unwrap()
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn live_pods(server: &Server, app: &str) -> Vec<String> {
    let out = server.kubectl_ok(&[
        "get",
        "pods",
        "-l",
        &format!("app={app}"),
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
    ]);
    out.lines().filter(|l| l.split_whitespace().count() == 1).map(|l| l.trim().to_string()).collect()
}

/// The seed's own example, end to end with the controllers of `server` or of `controller_manager`.
async fn sandboxed_deployment_lifecycle(server: &Server, runtime: &Runtime, agent: &Agent, images: &[String; 2]) {
    node_ready(server, NODE).await;
    apply(
        server,
        serde_json::json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "gvisor"}, "handler": "gvisor"}),
    );
    apply(server, deployment("sandboxed-nginx", 3, Some("gvisor"), &images[0], serde_json::json!({})));
    rollout_status(server, "sandboxed-nginx");
    let ready = server.kubectl_ok(&[
        "get",
        "deployment",
        "sandboxed-nginx",
        "-o",
        "jsonpath={.status.readyReplicas}/{.spec.replicas}",
    ]);
    assert_eq!(ready, "3/3");
    // Every pod really runs under runsc.
    let sandboxes = String::from_utf8_lossy(&runtime.cri(&["pods", "-o", "json"]).stdout).to_string();
    let handlers: Vec<String> = serde_json::from_str::<serde_json::Value>(&sandboxes).unwrap()["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["labels"]["app"] == "sandboxed-nginx" && p["state"] == "SANDBOX_READY")
        .map(|p| p["runtimeHandler"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(handlers, vec!["gvisor"; 3], "{sandboxes}");

    server.kubectl_ok(&["scale", "deployment", "sandboxed-nginx", "--replicas=5"]);
    rollout_status(server, "sandboxed-nginx");
    assert_eq!(live_pods(server, "sandboxed-nginx").len(), 5);
    server.kubectl_ok(&["scale", "deployment", "sandboxed-nginx", "--replicas=1"]);
    eventually("one pod left", || async { (live_pods(server, "sandboxed-nginx").len() == 1).then_some(()) }).await;
    server.kubectl_ok(&["scale", "deployment", "sandboxed-nginx", "--replicas=3"]);
    rollout_status(server, "sandboxed-nginx");
    let first_rs =
        server.kubectl_ok(&["get", "rs", "-l", "app=sandboxed-nginx", "-o", "jsonpath={.items[0].metadata.name}"]);

    // An image change rolls out; watched from outside, the pods never exceed replicas + maxSurge
    // (3 + 1) and never fall below replicas - maxUnavailable (3 - 0) Ready.
    let watch = PodWatch::start(server.client().await, "sandboxed-nginx");
    tokio::time::sleep(Duration::from_secs(1)).await;
    watch.arm();
    server.kubectl_ok(&["set", "image", "deployment/sandboxed-nginx", &format!("nginx={}", images[1])]);
    rollout_status(server, "sandboxed-nginx");
    let (most, fewest_ready) = watch.extremes();
    assert!(most <= 4, "at most replicas + maxSurge pods at once, saw {most}");
    assert!(fewest_ready >= 3, "never fewer than replicas - maxUnavailable Ready, saw {fewest_ready}");
    let history = server.kubectl_ok(&["rollout", "history", "deployment/sandboxed-nginx"]);
    assert!(history.contains('1') && history.contains('2'), "{history}");

    server.kubectl_ok(&["rollout", "undo", "deployment/sandboxed-nginx"]);
    rollout_status(server, "sandboxed-nginx");
    let owners = server.kubectl_ok(&[
        "get",
        "pods",
        "-l",
        "app=sandboxed-nginx",
        "-o",
        "jsonpath={range .items[*]}{.metadata.ownerReferences[0].name}{\"\\n\"}{end}",
    ]);
    eventually("the undone pods owned by the first ReplicaSet", || async {
        let owners = server.kubectl_ok(&[
            "get",
            "pods",
            "-l",
            "app=sandboxed-nginx",
            "-o",
            "jsonpath={range .items[*]}{.metadata.ownerReferences[0].name}{\"\\n\"}{end}",
        ]);
        owners.lines().all(|o| o == first_rs).then_some(())
    })
    .await;
    drop(owners);

    server.kubectl_ok(&["delete", "deployment", "sandboxed-nginx"]);
    eventually("no ReplicaSet or pod of the deleted Deployment", || async {
        let left = server.kubectl_ok(&["get", "rs,pods", "-l", "app=sandboxed-nginx", "-o", "name"]);
        left.trim().is_empty().then_some(())
    })
    .await;

    // --cascade=orphan leaves the ReplicaSet and its pods, without an owner.
    apply(server, deployment("orphaned", 2, None, &images[0], serde_json::json!({})));
    rollout_status(server, "orphaned");
    server.kubectl_ok(&["delete", "deployment", "orphaned", "--cascade=orphan"]);
    eventually("the Deployment gone", || async {
        server.kubectl(&["get", "deployment", "orphaned"]).status.code().filter(|c| *c != 0)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rs_owners =
        server.kubectl_ok(&["get", "rs", "-l", "app=orphaned", "-o", "jsonpath={.items[*].metadata.ownerReferences}"]);
    assert!(matches!(rs_owners.trim(), "" | "[]"), "the ReplicaSet has no owner left: {rs_owners}");
    assert_eq!(live_pods(server, "orphaned").len(), 2, "the pods stay:\n{}", agent.log());
    server.kubectl_ok(&["delete", "rs", "-l", "app=orphaned"]);
}

async fn two_images(registry: &Registry) -> [String; 2] {
    let one = registry.push_image("busybox", "1.0", &busybox_image(Format::Oci)).await.reference;
    let two = registry.push_image("busybox", "2.0", &busybox_image(Format::Docker)).await.reference;
    [one, two]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_sandboxed_deployment_runs_scales_rolls_out_undoes_and_goes_with_everything_it_owns() {
    let registry = Registry::start();
    let images = two_images(&registry).await;
    let server = Server::start();
    let runtime = Runtime::builder().insecure_registry(registry.host()).start();
    let agent = Agent::start(&server, NODE, &agent_toml(&[("berth", &runtime)], false));
    sandboxed_deployment_lifecycle(&server, &runtime, &agent, &images).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_controller_manager_runs_the_same_workloads() {
    let registry = Registry::start();
    let images = two_images(&registry).await;
    let server = Server::start_with(&["--controllers=-*"]);
    let runtime = Runtime::builder().insecure_registry(registry.host()).start();
    let agent = Agent::start(&server, NODE, &agent_toml(&[("berth", &runtime)], false));
    // Nothing makes pods for a ReplicaSet until the controller manager runs.
    node_ready(&server, NODE).await;
    apply(&server, deployment("waiting", 1, None, &images[0], serde_json::json!({})));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(server.kubectl_ok(&["get", "rs,pods", "-l", "app=waiting", "-o", "name"]).trim(), "");
    let _manager = ControlPart::controller_manager(&server, &[]);
    rollout_status(&server, "waiting");
    server.kubectl_ok(&["delete", "deployment", "waiting"]);
    sandboxed_deployment_lifecycle(&server, &runtime, &agent, &images).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_nodes_pods_are_evicted_and_replaced_on_the_other_node_and_its_taints_go_when_it_returns() {
    let registry = Registry::start();
    let images = two_images(&registry).await;
    let server = Server::start_with(&["--node-monitor-grace-period=10s", "--node-monitor-period=1s"]);
    let runtimes = [0, 1].map(|_| Runtime::builder().insecure_registry(registry.host()).start());
    let mut agents = [
        Agent::start(&server, "node-a", &agent_toml(&[("berth", &runtimes[0])], false)),
        Agent::start(&server, "node-b", &agent_toml(&[("berth", &runtimes[1])], false)),
    ];
    node_ready(&server, "node-a").await;
    node_ready(&server, "node-b").await;
    // Short toleration of unreachable nodes, so eviction comes quickly.
    let tolerations = serde_json::json!({"tolerations": [
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 3},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 3}
    ]});
    apply(&server, deployment("web", 4, None, &images[0], tolerations));
    rollout_status(&server, "web");
    let on_a = || {
        server
            .kubectl_ok(&[
                "get",
                "pods",
                "-l",
                "app=web",
                "-o",
                "jsonpath={range .items[*]}{.spec.nodeName}{\"\\n\"}{end}",
            ])
            .lines()
            .filter(|n| *n == "node-a")
            .count()
    };
    assert!(on_a() > 0, "the spreading scores put pods on both nodes");

    agents[0].kill9();
    let nodes: Api<Node> = Api::all(server.client().await);
    let tainted = eventually_within(Duration::from_secs(40), "node-a Unknown with the unreachable taints", || async {
        let node = nodes.get("node-a").await.ok()?;
        let ready = condition(&node, "Ready")?;
        let taints: Vec<(String, String)> =
            node.spec.as_ref()?.taints.as_ref()?.iter().map(|t| (t.key.clone(), t.effect.clone())).collect();
        (ready.status == "Unknown"
            && taints.contains(&("node.kubernetes.io/unreachable".into(), "NoSchedule".into()))
            && taints.contains(&("node.kubernetes.io/unreachable".into(), "NoExecute".into())))
        .then_some(node)
    })
    .await;
    assert_eq!(condition(&tainted, "Ready").unwrap().reason.as_deref(), Some("NodeStatusUnknown"));
    assert_eq!(condition(&tainted, "Ready").unwrap().message.as_deref(), Some("Kubelet stopped posting node status."));
    // Evicted after their 3 s; the Deployment's replacements run on node-b.
    eventually("the Deployment whole again on node-b", || async {
        let out = server.kubectl_ok(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "--field-selector=status.phase=Running",
            "-o",
            "jsonpath={range .items[*]}{.spec.nodeName} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
        ]);
        let live: Vec<&str> = out.lines().filter(|l| l.split_whitespace().count() == 1).collect();
        (live.len() == 4 && live.iter().all(|n| n.trim() == "node-b")).then_some(())
    })
    .await;

    agents[0].restart();
    eventually("node-a Ready again without the taints", || async {
        let node = nodes.get("node-a").await.ok()?;
        let ready = condition(&node, "Ready")?.status == "True";
        let tainted = node.spec.as_ref()?.taints.as_ref().is_some_and(|ts| {
            ts.iter()
                .any(|t| t.key.starts_with("node.kubernetes.io/unreachable") || t.key == "node.kubernetes.io/not-ready")
        });
        (ready && !tainted).then_some(())
    })
    .await;
    server.kubectl_ok(&["delete", "deployment", "web"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_interrupted_by_a_server_crash_finishes_without_extra_or_duplicate_pods() {
    let registry = Registry::start();
    let images = two_images(&registry).await;
    let mut server = Server::start();
    let runtime = Runtime::builder().insecure_registry(registry.host()).start();
    let _agent = Agent::start(&server, NODE, &agent_toml(&[("berth", &runtime)], false));
    node_ready(&server, NODE).await;
    apply(&server, deployment("web", 4, None, &images[0], serde_json::json!({})));
    rollout_status(&server, "web");

    // Count pods from outside every 100 ms for the whole rollout, across the crash.
    let most = Arc::new(Mutex::new(0usize));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let kubeconfig = server.kubeconfig();
    let (m, s) = (most.clone(), stop.clone());
    let counter = std::thread::spawn(move || {
        while !s.load(std::sync::atomic::Ordering::SeqCst) {
            let out = std::process::Command::new("kubectl")
                .env("KUBECONFIG", &kubeconfig)
                .args([
                    "get",
                    "pods",
                    "-l",
                    "app=web",
                    "-o",
                    "jsonpath={range .items[*]}{.metadata.deletionTimestamp}.{\"\\n\"}{end}",
                ])
                .output();
            if let Some(out) = out.ok().filter(|o| o.status.success()) {
                let live = String::from_utf8_lossy(&out.stdout).lines().filter(|l| *l == ".").count();
                let mut m = m.lock().unwrap();
                *m = (*m).max(live);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    server.kubectl_ok(&["set", "image", "deployment/web", &format!("nginx={}", images[1])]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.crash_and_restart();
    rollout_status(&server, "web");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    counter.join().unwrap();
    let most = *most.lock().unwrap();
    assert!(most <= 5, "never more than replicas + maxSurge (4 + 1) pods, saw {most}");
    let pods = live_pods(&server, "web");
    assert_eq!(pods.len(), 4, "exactly the replicas: {pods:?}");
    let images_now = server.kubectl_ok(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        "jsonpath={range .items[*]}{.spec.containers[0].image} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
    ]);
    let live_images: Vec<&str> = images_now.lines().filter(|l| l.split_whitespace().count() == 1).collect();
    assert!(live_images.iter().all(|i| i.trim() == images[1]), "{images_now}");
    let rs = server.kubectl_ok(&[
        "get",
        "rs",
        "-l",
        "app=web",
        "-o",
        "jsonpath={range .items[*]}{.status.replicas}{\"\\n\"}{end}",
    ]);
    let mut replicas: Vec<&str> = rs.lines().collect();
    replicas.sort();
    assert_eq!(replicas, vec!["0", "4"], "the old ReplicaSet is empty and the new one full");
    server.kubectl_ok(&["delete", "deployment", "web"]);
}
