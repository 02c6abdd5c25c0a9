//! The pod workers against a real `berth server` and a real `berth runtime` (runc, crun and gVisor
//! handlers; images from a loopback registry): pods created through the API with
//! `spec.nodeName` set run, report Kubernetes' status and events, fail clearly (missing class,
//! unknown handler, bad image, crash loop), are deleted gracefully and are recovered after the
//! workers restart. The workers run in the test process ([`berth_agent::pods::run`]), with the
//! runtime status poller of `berth agent`.
//!
//! Needs root, runc, runsc, the CNI plugins, busybox-static, docker-registry and kubectl; a
//! missing one fails the test.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_agent::endpoint::Endpoint;
use berth_agent::pods::{self, Settings};
use berth_agent::runtimes::RuntimeManager;
use berth_testenv::Registry;
use berth_testenv::images::{Format, busybox_image};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, PodCondition, Secret};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

/// A server, a runtime, a registry with busybox, and pod workers for node `node-a`.
struct Cluster {
    // Dropped in this order: workers first, then the runtime (which removes leftover pods).
    agents: Vec<Workers>,
    client: kube::Client,
    busybox: String,
    /// UIDs of the pods made, whose cgroups go at the end.
    uids: std::sync::Mutex<Vec<String>>,
    registry: Registry,
    runtime: common::Runtime,
    _server: common::Server,
}

/// The pod workers of one node, in this process.
struct Workers {
    node: String,
    dir: tempfile::TempDir,
    runtimes: Arc<RuntimeManager>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Workers {
    fn log_dir(&self) -> PathBuf {
        self.dir.path().join("logs")
    }

    /// Stops the workers as a crash would (the runtime keeps every container).
    fn kill(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.kill();
        // Memory-backed volumes are tmpfs mounts under the root dir.
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let root = self.dir.path().display().to_string();
        for point in mounts.lines().filter_map(|l| l.split(' ').nth(4)).filter(|p| p.starts_with(&root)) {
            let _ = std::process::Command::new("umount").args(["-l", point]).status();
        }
    }
}

/// The workers' logs in the test's output (shown when it fails); `BERTH_LOG` filters them.
fn init_logs() {
    let filter = std::env::var("BERTH_LOG").unwrap_or_else(|_| "berth_agent=debug".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}

impl Cluster {
    async fn start() -> Cluster {
        Cluster::start_with(Registry::start()).await
    }

    /// With images from `registry` (busybox is pushed there).
    async fn start_with(registry: Registry) -> Cluster {
        init_logs();
        let pushed = registry.push_image("busybox", "1.0", &busybox_image(Format::Oci)).await;
        let runtime = common::Runtime::builder().insecure_registry(registry.host()).start();
        let server = common::Server::start();
        let client = server.client().await;
        let mut cluster = Cluster {
            agents: Vec::new(),
            client,
            busybox: pushed.reference.clone(),
            uids: Default::default(),
            registry,
            runtime,
            _server: server,
        };
        cluster.start_workers("node-a");
        cluster
    }

    /// Starts pod workers for `node` (again after [`Workers::kill`], on the same dirs and cache).
    fn start_workers(&mut self, node: &str) {
        let i = match self.agents.iter().position(|a| a.node == node) {
            Some(i) => i,
            None => {
                let runtimes = Arc::new(RuntimeManager::new(node));
                let ep = Endpoint::connect_lazy("container", "berth", &self.runtime.endpoint(), "").unwrap();
                runtimes.set_endpoints(vec![ep]);
                let dir = tempfile::tempdir().unwrap();
                self.agents.push(Workers { node: node.to_string(), dir, runtimes, tasks: Vec::new() });
                self.agents.len() - 1
            }
        };
        let (root, runtimes) = (self.agents[i].dir.path().to_path_buf(), self.agents[i].runtimes.clone());
        let poller = {
            let runtimes = runtimes.clone();
            tokio::spawn(async move {
                loop {
                    berth_agent::agent::poll_once(&runtimes).await;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            })
        };
        let settings = Settings {
            client: self.client.clone(),
            node_name: node.to_string(),
            runtimes,
            root_dir: root.join("root"),
            pod_log_dir: root.join("logs"),
            image_gc_thresholds: Box::new(|| (85, 80)),
            cluster_dns: Vec::new(),
            cluster_domain: "cluster.local".into(),
        };
        let workers = tokio::spawn(async move {
            if let Err(e) = pods::run(settings).await {
                panic!("pod workers stopped: {e}");
            }
        });
        self.agents[i].tasks = vec![poller, workers];
    }

    /// Runs `argv` in a container (`berth://<id>` or a bare ID) through the runtime's CLI.
    fn exec(&self, container_id: &str, argv: &[&str]) {
        let id = container_id.trim_start_matches("berth://");
        let mut args = vec!["exec", id];
        args.extend_from_slice(argv);
        let out = self.runtime.cri(&args);
        assert!(out.status.success(), "berth cri exec {argv:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Sandbox states (`SANDBOX_READY`/`SANDBOX_NOTREADY`) and container states of the pod, through CRI.
    async fn cri_states(&self, uid: &str) -> (Vec<i32>, Vec<i32>) {
        let ep = Endpoint::connect_lazy("container", "test", &self.runtime.endpoint(), "").unwrap();
        let labels = std::collections::HashMap::from([("io.kubernetes.pod.uid".to_string(), uid.to_string())]);
        let sandboxes = ep
            .runtime
            .clone()
            .list_pod_sandbox(k8s_cri::v1::ListPodSandboxRequest {
                filter: Some(k8s_cri::v1::PodSandboxFilter { label_selector: labels.clone(), ..Default::default() }),
            })
            .await
            .unwrap()
            .into_inner()
            .items;
        let containers = ep
            .runtime
            .clone()
            .list_containers(k8s_cri::v1::ListContainersRequest {
                filter: Some(k8s_cri::v1::ContainerFilter { label_selector: labels, ..Default::default() }),
            })
            .await
            .unwrap()
            .into_inner()
            .containers;
        (sandboxes.iter().map(|s| s.state).collect(), containers.iter().map(|c| c.state).collect())
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    async fn create(&self, pod: serde_json::Value) -> Pod {
        let pod: Pod = serde_json::from_value(pod).unwrap();
        let created = self.pods().create(&PostParams::default(), &pod).await.unwrap();
        self.uids.lock().unwrap().push(uid(&created));
        created
    }

    async fn runtime_class(&self, name: &str, handler: &str) {
        let rc: RuntimeClass =
            serde_json::from_value(json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name}, "handler": handler}))
                .unwrap();
        Api::<RuntimeClass>::all(self.client.clone()).create(&PostParams::default(), &rc).await.unwrap();
    }

    /// Waits until the pod satisfies `ok`, showing its last status on timeout.
    async fn wait_pod(&self, name: &str, what: &str, limit: Duration, ok: impl Fn(&Pod) -> bool) -> Pod {
        let deadline = Instant::now() + limit;
        loop {
            let pod = self.pods().get_opt(name).await.unwrap();
            if let Some(p) = pod.as_ref().filter(|p| ok(p)) {
                return p.clone();
            }
            assert!(
                Instant::now() < deadline,
                "pod {name}: timed out after {limit:?} waiting for {what}; last: {}",
                serde_json::to_string_pretty(&pod.map(|p| p.status)).unwrap()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn events_of(&self, pod: &Pod) -> Vec<Event> {
        let uid = pod.metadata.uid.clone().unwrap();
        let all = Api::<Event>::namespaced(self.client.clone(), "default").list(&Default::default()).await.unwrap();
        all.items.into_iter().filter(|e| e.involved_object.uid.as_deref() == Some(uid.as_str())).collect()
    }

    /// Sandboxes in the runtime that belong to the pod with `uid`.
    fn sandboxes_of(&self, uid: &str) -> Vec<String> {
        self.runtime.sandboxes_of(uid)
    }
}

/// The directory of a cgroup in the hierarchy of `controller` (cgroup v1), or in the unified one.
fn cgroup_dir(cgroup: &str, controller: &str) -> PathBuf {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() { root.join(cgroup) } else { root.join(controller).join(cgroup) }
}

/// The pod cgroup's memory limit (`controller` "memory") or CPU quota ("cpu"), as the kernel has it.
fn cgroup_value(cgroup: &str, controller: &str) -> String {
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let file = match (controller, v2) {
        ("memory", false) => "memory.limit_in_bytes",
        ("memory", true) => "memory.max",
        (_, false) => "cpu.cfs_quota_us",
        (_, true) => "cpu.max",
    };
    let text = std::fs::read_to_string(cgroup_dir(cgroup, controller).join(file)).unwrap_or_default();
    text.split_whitespace().next().unwrap_or("").to_string()
}

impl Drop for Cluster {
    /// Pods still on the node at the end go without their agent: the runtime removes them, and
    /// their cgroups are removed here.
    fn drop(&mut self) {
        for a in &mut self.agents {
            a.kill();
        }
        self.runtime.remove_all_pods();
        // gVisor containers' host side goes in the background: wait for it before the runtime
        // stops, or their rootfs mounts stay behind.
        let containers = self.runtime.dir.path().join("root/containers");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::fs::read_dir(&containers).is_ok_and(|mut d| d.next().is_some()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let hierarchies: Vec<PathBuf> =
            std::fs::read_dir("/sys/fs/cgroup").map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
        for uid in self.uids.lock().unwrap().iter() {
            for qos in ["", "burstable/", "besteffort/"] {
                for h in hierarchies.iter().chain([PathBuf::from("/sys/fs/cgroup")].iter()) {
                    remove_cgroup_tree(&h.join(format!("kubepods/{qos}pod{uid}")));
                }
            }
        }
    }
}

fn remove_cgroup_tree(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

fn phase(p: &Pod) -> &str {
    p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

fn condition<'a>(p: &'a Pod, kind: &str) -> Option<&'a PodCondition> {
    p.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == kind)
}

fn waiting_reason(p: &Pod, container: &str) -> Option<(String, String)> {
    let cs = p.status.as_ref()?.container_statuses.as_ref()?.iter().find(|c| c.name == container)?;
    let w = cs.state.as_ref()?.waiting.as_ref()?;
    Some((w.reason.clone().unwrap_or_default(), w.message.clone().unwrap_or_default()))
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap()
}

/// The text of a CRI log file (`<time> <stream> <tag> <text>` lines).
fn log_text(path: &Path) -> String {
    let raw = std::fs::read_to_string(path).unwrap_or_default();
    raw.lines().filter_map(|l| l.splitn(4, ' ').nth(3)).collect::<Vec<_>>().join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_bound_to_the_node_runs_with_kubernetes_status_and_events() {
    let c = Cluster::start().await;
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "settings"}, "data": {"GREETING": "hello", "app.conf": "level=debug\n"}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(c.client.clone(), "default").create(&PostParams::default(), &cm).await.unwrap();
    let created = c
        .create(json!({
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {
                "nodeName": "node-a",
                "initContainers": [{"name": "setup", "image": c.busybox,
                    "command": ["sh", "-c", "echo prepared > /work/ready"],
                    "volumeMounts": [{"name": "work", "mountPath": "/work"}]}],
                "containers": [{"name": "app", "image": c.busybox,
                    "command": ["sh", "-c", "cat /work/ready; echo $GREETING $POD_NAME; cat /etc/app/app.conf; exec sleep 3600"],
                    "env": [
                        {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "GREETING"}}},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                    ],
                    "volumeMounts": [{"name": "work", "mountPath": "/work"}, {"name": "config", "mountPath": "/etc/app"}]}],
                "volumes": [{"name": "work", "emptyDir": {}}, {"name": "config", "configMap": {"name": "settings"}}]
            }
        }))
        .await;
    let pod = c
        .wait_pod("web", "Running and Ready", common::PATIENCE, |p| {
            phase(p) == "Running" && condition(p, "Ready").is_some_and(|c| c.status == "True")
        })
        .await;
    let status = pod.status.clone().unwrap();
    for kind in ["PodScheduled", "PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready"] {
        let cond = condition(&pod, kind).unwrap_or_else(|| panic!("no {kind} condition"));
        assert_eq!(cond.status, "True", "{kind}");
        assert!(cond.last_transition_time.is_some(), "{kind} has a transition time");
    }
    let pod_ip = status.pod_ip.clone().expect("a pod IP");
    assert!(pod_ip.starts_with("10."), "the pod IP comes from the sandbox's network: {pod_ip}");
    assert_eq!(status.pod_ips.as_ref().map(|ips| ips[0].ip.clone()), Some(pod_ip));
    assert!(status.host_ip.is_some() && status.start_time.is_some());
    assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    let app = &status.container_statuses.as_ref().unwrap()[0];
    assert_eq!((app.name.as_str(), app.ready, app.started, app.restart_count), ("app", true, Some(true), 0));
    assert!(app.container_id.as_deref().unwrap().starts_with("berth://"), "{:?}", app.container_id);
    assert!(!app.image_id.is_empty());
    assert_eq!(app.image, c.busybox);
    assert!(app.state.as_ref().unwrap().running.as_ref().unwrap().started_at.is_some());
    let setup = &status.init_container_statuses.as_ref().unwrap()[0];
    let done = setup.state.as_ref().unwrap().terminated.as_ref().expect("the init container finished");
    assert_eq!((done.exit_code, done.reason.as_deref()), (0, Some("Completed")));

    let log = c.agents[0].log_dir().join(format!("default_web_{}", uid(&pod))).join("app/0.log");
    let text = common::eventually("the container's output", || {
        let text = log_text(&log);
        async move { text.contains("level=debug").then_some(text) }
    })
    .await;
    assert_eq!(text, "prepared\nhello web\nlevel=debug", "init container, env and configMap volume reached it");

    let events = c.events_of(&created).await;
    let reasons: Vec<&str> = events.iter().filter_map(|e| e.reason.as_deref()).collect();
    for reason in ["Pulling", "Pulled", "Created", "Started"] {
        assert!(reasons.contains(&reason), "no {reason} event in {reasons:?}");
    }
    let started = events.iter().find(|e| e.reason.as_deref() == Some("Started")).unwrap();
    let source = started.source.as_ref().unwrap();
    assert_eq!((source.component.as_deref(), source.host.as_deref()), (Some("kubelet"), Some("node-a")));
    assert!(
        started.involved_object.field_path.as_deref().unwrap().starts_with("spec."),
        "{:?}",
        started.involved_object
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gvisor_pod_really_runs_under_runsc() {
    let c = Cluster::start().await;
    c.runtime_class("gvisor", "gvisor").await;
    let pod = c
        .create(json!({
            "metadata": {"name": "sandboxed"},
            "spec": {
                "nodeName": "node-a", "runtimeClassName": "gvisor", "restartPolicy": "Never",
                "containers": [{"name": "app", "image": c.busybox, "command": ["dmesg"],
                    "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}}}]
            }
        }))
        .await;
    let done = c.wait_pod("sandboxed", "Succeeded", common::PATIENCE, |p| phase(p) == "Succeeded").await;
    let cs = &done.status.as_ref().unwrap().container_statuses.as_ref().unwrap()[0];
    assert_eq!(cs.state.as_ref().unwrap().terminated.as_ref().unwrap().exit_code, 0);
    let log = c.agents[0].log_dir().join(format!("default_sandboxed_{}", uid(&pod))).join("app/0.log");
    let text = log_text(&log);
    assert!(text.contains("Starting gVisor"), "dmesg shows gVisor's banner: {text}");
    assert_eq!(condition(&done, "Ready").and_then(|c| c.reason.as_deref()), Some("PodCompleted"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_handler_keeps_the_pod_pending_with_runtime_handler_not_found() {
    let c = Cluster::start().await;
    c.runtime_class("kata", "kata").await;
    let pod = c
        .create(json!({
            "metadata": {"name": "vm"},
            "spec": {"nodeName": "node-a", "runtimeClassName": "kata",
                     "containers": [{"name": "app", "image": c.busybox}]}
        }))
        .await;
    let expected =
        "runtime handler \"kata\" is not served by any runtime on node node-a (available: crun, gvisor, runc)";
    let pending = c
        .wait_pod("vm", "RuntimeHandlerNotFound", common::PATIENCE, |p| {
            condition(p, "PodReadyToStartContainers")
                .is_some_and(|c| c.reason.as_deref() == Some("RuntimeHandlerNotFound"))
        })
        .await;
    let cond = condition(&pending, "PodReadyToStartContainers").unwrap();
    assert_eq!((cond.status.as_str(), cond.message.as_deref()), ("False", Some(expected)));
    assert_eq!(phase(&pending), "Pending");
    let events = common::eventually("the RuntimeHandlerNotFound event", || async {
        let events = c.events_of(&pod).await;
        events.into_iter().find(|e| e.reason.as_deref() == Some("RuntimeHandlerNotFound"))
    })
    .await;
    assert_eq!((events.type_.as_deref(), events.message.as_deref()), (Some("Warning"), Some(expected)));
    assert!(c.sandboxes_of(&uid(&pod)).is_empty(), "no sandbox was made");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_class_deleted_after_admission_fails_the_pod() {
    let mut c = Cluster::start().await;
    // A pod of node-a in the runtime node-b's agent shares: not node-b's to touch.
    let neighbour = c
        .create(json!({
            "metadata": {"name": "neighbour"},
            "spec": {"nodeName": "node-a", "containers": [{"name": "app", "image": c.busybox, "command": ["sleep", "3600"]}]}
        }))
        .await;
    c.wait_pod("neighbour", "Running", common::PATIENCE, |p| phase(p) == "Running").await;
    let neighbour_sandbox = c.sandboxes_of(&uid(&neighbour));
    c.runtime_class("doomed", "runc").await;
    let pod = c
        .create(json!({
            "metadata": {"name": "orphaned-class"},
            "spec": {"nodeName": "node-b", "runtimeClassName": "doomed",
                     "containers": [{"name": "app", "image": c.busybox}]}
        }))
        .await;
    Api::<RuntimeClass>::all(c.client.clone()).delete("doomed", &DeleteParams::default()).await.unwrap();
    c.start_workers("node-b");
    let failed = c.wait_pod("orphaned-class", "Failed", common::PATIENCE, |p| phase(p) == "Failed").await;
    let status = failed.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("RuntimeClassNotFound"));
    assert_eq!(status.message.as_deref(), Some("RuntimeClass \"doomed\" not found"));
    assert!(c.sandboxes_of(&uid(&pod)).is_empty(), "no sandbox was made");
    assert_eq!(c.sandboxes_of(&uid(&neighbour)), neighbour_sandbox, "node-b left node-a's pod alone");
    assert_eq!(phase(&c.pods().get("neighbour").await.unwrap()), "Running");
    let event = common::eventually("the RuntimeClassNotFound event", || async {
        c.events_of(&pod).await.into_iter().find(|e| e.reason.as_deref() == Some("RuntimeClassNotFound"))
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_is_err_image_pull_then_image_pull_back_off() {
    let c = Cluster::start().await;
    let missing = c.registry.reference("nope:1.0");
    c.create(json!({
        "metadata": {"name": "badimage"},
        "spec": {"nodeName": "node-a", "containers": [{"name": "app", "image": missing}]}
    }))
    .await;
    let pulled = c
        .wait_pod("badimage", "ErrImagePull", common::PATIENCE, |p| {
            waiting_reason(p, "app").is_some_and(|(r, _)| r == "ErrImagePull")
        })
        .await;
    let (_, message) = waiting_reason(&pulled, "app").unwrap();
    assert!(message.starts_with("rpc error: code = "), "the runtime's error, as kubelet shows it: {message}");
    let backoff = c
        .wait_pod("badimage", "ImagePullBackOff", Duration::from_secs(30), |p| {
            waiting_reason(p, "app").is_some_and(|(r, _)| r == "ImagePullBackOff")
        })
        .await;
    let (_, message) = waiting_reason(&backoff, "app").unwrap();
    assert!(message.starts_with(&format!("Back-off pulling image {missing:?}: ErrImagePull: rpc error")), "{message}");
    assert_eq!(phase(&backoff), "Pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_container_goes_into_crash_loop_back_off_and_counts_restarts() {
    let c = Cluster::start().await;
    let pod = c
        .create(json!({
            "metadata": {"name": "crash"},
            "spec": {"nodeName": "node-a",
                     "containers": [{"name": "app", "image": c.busybox, "command": ["sh", "-c", "echo dying; exit 3"]}]}
        }))
        .await;
    let looping = c
        .wait_pod("crash", "CrashLoopBackOff", common::PATIENCE, |p| {
            waiting_reason(p, "app").is_some_and(|(r, _)| r == "CrashLoopBackOff")
        })
        .await;
    let (_, message) = waiting_reason(&looping, "app").unwrap();
    assert_eq!(message, format!("back-off 10s restarting failed container=app pod=crash_default({})", uid(&pod)));
    let cs = &looping.status.as_ref().unwrap().container_statuses.as_ref().unwrap()[0];
    assert_eq!(cs.restart_count, 1, "restarted once at once, then held back");
    let last = cs.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!((last.exit_code, last.reason.as_deref()), (3, Some("Error")));
    assert_eq!(phase(&looping), "Running", "restartPolicy Always keeps it Running");
    // The back-off is 10 s: the next restart comes after it.
    let restarted = c
        .wait_pod("crash", "a second restart", Duration::from_secs(40), |p| {
            p.status.as_ref().and_then(|s| s.container_statuses.as_ref()).is_some_and(|cs| cs[0].restart_count >= 2)
        })
        .await;
    assert!(restarted.status.unwrap().container_statuses.unwrap()[0].restart_count >= 2);
    let events = c.events_of(&pod).await;
    assert!(events.iter().any(|e| e.reason.as_deref() == Some("BackOff")), "a BackOff event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_pod_whose_active_deadline_is_lowered_fails_with_deadline_exceeded() {
    let c = Cluster::start().await;
    let pod = c
        .create(json!({
            "metadata": {"name": "deadline"},
            "spec": {"nodeName": "node-a", "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "app", "image": c.busybox, "command": ["sleep", "3600"]}]}
        }))
        .await;
    c.wait_pod("deadline", "Running", common::PATIENCE, |p| phase(p) == "Running").await;
    let patch = json!({"spec": {"activeDeadlineSeconds": 2}});
    c.pods().patch("deadline", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await.unwrap();
    let failed = c.wait_pod("deadline", "Failed", Duration::from_secs(30), |p| phase(p) == "Failed").await;
    let status = failed.status.as_ref().unwrap();
    assert_eq!(status.reason.as_deref(), Some("DeadlineExceeded"));
    assert_eq!(status.message.as_deref(), Some("Pod was active on the node longer than the specified deadline"));
    let stopped = c
        .wait_pod("deadline", "its container stopped", Duration::from_secs(30), |p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|cs| cs[0].state.as_ref().is_some_and(|st| st.terminated.is_some()))
        })
        .await;
    assert_eq!(phase(&stopped), "Failed", "a failed pod stays failed");
    let events = c.events_of(&pod).await;
    assert!(events.iter().any(|e| e.reason.as_deref() == Some("DeadlineExceeded")), "a DeadlineExceeded event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_is_graceful_runs_pre_stop_and_leaves_no_sandbox() {
    let c = Cluster::start().await;
    let host = tempfile::tempdir().unwrap();
    let pod = c
        .create(json!({
            "metadata": {"name": "graceful"},
            "spec": {
                "nodeName": "node-a", "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "app", "image": c.busybox,
                    "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m", "memory": "64Mi"}},
                    "command": ["sh", "-c", "trap 'echo term >> /host/log; exit 0' TERM; while true; do sleep 0.2; done"],
                    "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "echo prestop >> /host/log"]}}},
                    "volumeMounts": [{"name": "host", "mountPath": "/host"}]}],
                "volumes": [{"name": "host", "hostPath": {"path": host.path().join("shared"), "type": "DirectoryOrCreate"}}]
            }
        }))
        .await;
    c.wait_pod("graceful", "Running", common::PATIENCE, |p| phase(p) == "Running").await;
    assert_eq!(c.sandboxes_of(&uid(&pod)).len(), 1);
    let cgroup = format!("kubepods/burstable/pod{}", uid(&pod));
    assert_eq!(cgroup_value(&cgroup, "memory"), (64 << 20).to_string(), "the pod's cgroup has its limits");
    assert_eq!(cgroup_value(&cgroup, "cpu"), "50000");
    let started = Instant::now();
    c.pods().delete("graceful", &DeleteParams::default()).await.unwrap();
    common::eventually("the pod object to go", || async {
        c.pods().get_opt("graceful").await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(25), "the container exited on SIGTERM, not at the deadline");
    let log = std::fs::read_to_string(host.path().join("shared/log")).unwrap();
    assert_eq!(log, "prestop\nterm\n", "preStop ran, then SIGTERM");
    assert!(c.sandboxes_of(&uid(&pod)).is_empty(), "no sandbox left");
    let pod_dir = c.agents[0].dir.path().join("root/pods").join(uid(&pod));
    assert!(!pod_dir.exists(), "the pod's directory is removed");
    assert!(!cgroup_dir(&cgroup, "memory").exists(), "the pod's cgroup is removed");
    let events = c.events_of(&pod).await;
    assert!(events.iter().any(|e| e.reason.as_deref() == Some("Killing")), "a Killing event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_workers_adopt_running_pods_and_clean_up_pods_deleted_meanwhile() {
    let mut c = Cluster::start().await;
    for name in ["keep", "gone"] {
        c.create(json!({
            "metadata": {"name": name},
            "spec": {"nodeName": "node-a", "terminationGracePeriodSeconds": 2,
                     "containers": [{"name": "app", "image": c.busybox, "command": ["sleep", "3600"]}]}
        }))
        .await;
    }
    let keep = c.wait_pod("keep", "Running", common::PATIENCE, |p| phase(p) == "Running").await;
    let gone = c.wait_pod("gone", "Running", common::PATIENCE, |p| phase(p) == "Running").await;
    let keep_sandbox = c.sandboxes_of(&uid(&keep));
    let keep_container = keep.status.as_ref().unwrap().container_statuses.as_ref().unwrap()[0].container_id.clone();

    c.agents[0].kill();
    // While no worker runs: one pod force-deleted, one created.
    c.pods().delete("gone", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    c.create(json!({
        "metadata": {"name": "new"},
        "spec": {"nodeName": "node-a", "containers": [{"name": "app", "image": c.busybox, "command": ["sleep", "3600"]}]}
    }))
    .await;
    c.start_workers("node-a");

    let new = c.wait_pod("new", "Running", common::PATIENCE, |p| phase(p) == "Running").await;
    common::eventually("the deleted pod's sandbox to go", || async {
        c.sandboxes_of(&uid(&gone)).is_empty().then_some(())
    })
    .await;
    assert_eq!(c.sandboxes_of(&uid(&keep)), keep_sandbox, "the running pod kept its one sandbox");
    assert_eq!(c.sandboxes_of(&uid(&new)).len(), 1);
    let keep = c.pods().get("keep").await.unwrap();
    let cs = &keep.status.as_ref().unwrap().container_statuses.as_ref().unwrap()[0];
    assert_eq!((cs.container_id.clone(), cs.restart_count), (keep_container, 0), "the same container, not restarted");
    let all = c.runtime.cri(&["pods", "-q"]);
    assert_eq!(String::from_utf8_lossy(&all.stdout).split_whitespace().count(), 2, "exactly the two pods' sandboxes");
}

fn container_status(p: &Pod, name: &str) -> k8s_openapi::api::core::v1::ContainerStatus {
    p.status.as_ref().unwrap().container_statuses.as_ref().unwrap().iter().find(|c| c.name == name).unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_restart_an_unhealthy_container_and_readiness_drives_ready() {
    let c = Cluster::start().await;
    let exec = |path: &str| json!({"exec": {"command": ["cat", path]}, "periodSeconds": 1, "failureThreshold": 1});
    let pod = c
        .create(json!({
            "metadata": {"name": "probed"},
            "spec": {"nodeName": "node-a", "terminationGracePeriodSeconds": 2,
                     "containers": [{"name": "app", "image": c.busybox,
                        "command": ["sh", "-c", "touch /tmp/healthy /tmp/ready; exec sleep 3600"],
                        "livenessProbe": exec("/tmp/healthy"), "readinessProbe": exec("/tmp/ready")}]}
        }))
        .await;
    let ready = c
        .wait_pod("probed", "Ready", common::PATIENCE, |p| condition(p, "Ready").is_some_and(|c| c.status == "True"))
        .await;
    let id = container_status(&ready, "app").container_id.unwrap();

    c.exec(&id, &["rm", "/tmp/ready"]);
    let unready = c
        .wait_pod("probed", "not ready", Duration::from_secs(20), |p| {
            condition(p, "Ready").is_some_and(|c| c.status == "False")
        })
        .await;
    assert_eq!(phase(&unready), "Running");
    let cs = container_status(&unready, "app");
    assert!(!cs.ready && cs.started == Some(true) && cs.restart_count == 0, "{cs:?}");
    assert_eq!(
        condition(&unready, "ContainersReady").unwrap().message.as_deref(),
        Some("containers with unready status: [app]")
    );

    c.exec(&id, &["rm", "/tmp/healthy"]);
    let restarted = c
        .wait_pod("probed", "a restart, ready again", Duration::from_secs(40), |p| {
            let cs = container_status(p, "app");
            cs.restart_count == 1 && cs.ready
        })
        .await;
    let cs = container_status(&restarted, "app");
    assert_ne!(cs.container_id.as_deref(), Some(id.as_str()));
    let last = cs.last_state.unwrap().terminated.unwrap();
    assert_eq!(last.container_id.as_deref(), Some(id.as_str()), "the killed container is the last state");
    let events = c.events_of(&pod).await;
    let message = |reason: &str| -> Vec<String> {
        events.iter().filter(|e| e.reason.as_deref() == Some(reason)).filter_map(|e| e.message.clone()).collect()
    };
    assert!(
        message("Unhealthy").iter().any(|m| m.starts_with("Readiness probe failed: ")),
        "{:?}",
        message("Unhealthy")
    );
    assert!(
        message("Unhealthy").iter().any(|m| m.starts_with("Liveness probe failed: ")),
        "{:?}",
        message("Unhealthy")
    );
    assert!(message("Killing").contains(&"Container app failed liveness probe, will be restarted".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_downward_api_memory_volumes_dns_and_post_start_reach_the_container() {
    let c = Cluster::start().await;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "creds"}, "stringData": {"password": "hunter2", "unused": "x"}
    }))
    .unwrap();
    Api::<Secret>::namespaced(c.client.clone(), "default").create(&PostParams::default(), &secret).await.unwrap();
    let script = "while [ ! -f /scratch/poststart ]; do sleep 0.1; done; \
        cat /scratch/poststart; cat /etc/creds/pw; echo; stat -c %a /etc/creds/..data/pw; ls /etc/creds; \
        cat /etc/info/name; echo; cat /etc/info/labels; echo; grep ' /cache ' /proc/mounts | cut -d' ' -f3; \
        cat /etc/resolv.conf";
    let pod = c
        .create(json!({
            "metadata": {"name": "files", "labels": {"app": "files"}},
            "spec": {
                "nodeName": "node-a", "restartPolicy": "Never", "dnsPolicy": "None",
                "dnsConfig": {"nameservers": ["192.0.2.53"], "searches": ["example.test"], "options": [{"name": "ndots", "value": "2"}]},
                "containers": [{"name": "app", "image": c.busybox, "command": ["sh", "-c", script],
                    "lifecycle": {"postStart": {"exec": {"command": ["sh", "-c", "echo started > /scratch/poststart"]}}},
                    "volumeMounts": [
                        {"name": "creds", "mountPath": "/etc/creds"}, {"name": "info", "mountPath": "/etc/info"},
                        {"name": "cache", "mountPath": "/cache"}, {"name": "scratch", "mountPath": "/scratch"}]}],
                "volumes": [
                    {"name": "creds", "secret": {"secretName": "creds", "defaultMode": 0o400,
                        "items": [{"key": "password", "path": "pw"}]}},
                    {"name": "info", "downwardAPI": {"items": [
                        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
                    {"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
                    {"name": "scratch", "emptyDir": {}}]
            }
        }))
        .await;
    let done = c.wait_pod("files", "Succeeded", common::PATIENCE, |p| phase(p) == "Succeeded").await;
    let log = c.agents[0].log_dir().join(format!("default_files_{}", uid(&pod))).join("app/0.log");
    assert_eq!(
        log_text(&log),
        "started\nhunter2\n400\npw\nfiles\napp=\"files\"\ntmpfs\nsearch example.test\nnameserver 192.0.2.53\noptions ndots:2",
        "postStart ran first; the secret's item with its mode; the downward API; a tmpfs; exactly the pod's DNS"
    );
    // A finished pod keeps its container (for logs) and stops its sandbox.
    let stopped = (
        vec![k8s_cri::v1::PodSandboxState::SandboxNotready as i32],
        vec![k8s_cri::v1::ContainerState::ContainerExited as i32],
    );
    common::eventually("the sandbox stopped, the container kept", || async {
        (c.cri_states(&uid(&done)).await == stopped).then_some(())
    })
    .await;
    c.pods().delete("files", &DeleteParams::default()).await.unwrap();
    common::eventually("the finished pod's sandbox to go", || async {
        (c.cri_states(&uid(&done)).await == (vec![], vec![])).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_volumes_and_missing_keys_are_reported_and_wait() {
    let c = Cluster::start().await;
    let pvc = c
        .create(json!({
            "metadata": {"name": "claims"},
            "spec": {"nodeName": "node-a",
                     "containers": [{"name": "app", "image": c.busybox, "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}
        }))
        .await;
    let event = common::eventually("a FailedMount event", || async {
        c.events_of(&pvc).await.into_iter().find(|e| e.reason.as_deref() == Some("FailedMount"))
    })
    .await;
    assert_eq!(
        event.message.as_deref(),
        Some(
            "MountVolume.SetUp failed for volume \"data\" : volume type persistentVolumeClaim is not supported by berth's agent"
        )
    );
    let waiting = c.pods().get("claims").await.unwrap();
    assert_eq!(waiting_reason(&waiting, "app").map(|w| w.0).as_deref(), Some("ContainerCreating"));

    c.create(json!({
        "metadata": {"name": "envless"},
        "spec": {"nodeName": "node-a",
                 "containers": [{"name": "app", "image": c.busybox, "command": ["sleep", "3600"],
                    "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}]}]}
    }))
    .await;
    let blocked = c
        .wait_pod("envless", "CreateContainerConfigError", common::PATIENCE, |p| {
            waiting_reason(p, "app").is_some_and(|(r, _)| r == "CreateContainerConfigError")
        })
        .await;
    assert_eq!(waiting_reason(&blocked, "app").unwrap().1, "secret \"absent\" not found");
    // Once the secret exists, the container starts.
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "absent"}, "stringData": {"k": "v"}})).unwrap();
    Api::<Secret>::namespaced(c.client.clone(), "default").create(&PostParams::default(), &secret).await.unwrap();
    c.wait_pod("envless", "Running", common::PATIENCE, |p| phase(p) == "Running").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_pull_secrets_authenticate_pulls() {
    let c = Cluster::start_with(Registry::start_basic_auth("puller", "s3cret")).await;
    let spec = |secrets: serde_json::Value| {
        json!({"nodeName": "node-a", "imagePullSecrets": secrets,
               "containers": [{"name": "app", "image": c.busybox, "command": ["sleep", "3600"]}]})
    };
    c.create(json!({"metadata": {"name": "anonymous"}, "spec": spec(json!([]))})).await;
    let denied = c
        .wait_pod("anonymous", "ErrImagePull", common::PATIENCE, |p| {
            waiting_reason(p, "app").is_some_and(|(r, _)| r == "ErrImagePull")
        })
        .await;
    assert!(waiting_reason(&denied, "app").unwrap().1.starts_with("rpc error: "));
    let config = json!({"auths": {c.registry.host(): {"username": "puller", "password": "s3cret"}}}).to_string();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "regcred"}, "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": config}
    }))
    .unwrap();
    Api::<Secret>::namespaced(c.client.clone(), "default").create(&PostParams::default(), &secret).await.unwrap();
    c.create(json!({"metadata": {"name": "authenticated"}, "spec": spec(json!([{"name": "regcred"}]))})).await;
    c.wait_pod("authenticated", "Running", common::PATIENCE, |p| phase(p) == "Running").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_that_dies_is_made_again_with_its_containers() {
    let c = Cluster::start().await;
    let pod = c
        .create(json!({
            "metadata": {"name": "phoenix"},
            "spec": {"nodeName": "node-a", "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "app", "image": c.busybox, "command": ["sleep", "3600"]}]}
        }))
        .await;
    let first = c.wait_pod("phoenix", "Running", common::PATIENCE, |p| phase(p) == "Running").await;
    let old = c.sandboxes_of(&uid(&pod));
    assert_eq!(old.len(), 1);
    let out = c.runtime.cri(&["stopp", &old[0]]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let again = c
        .wait_pod("phoenix", "running in a new sandbox", common::PATIENCE, |p| {
            let cs = container_status(p, "app");
            cs.restart_count == 1 && cs.state.as_ref().is_some_and(|s| s.running.is_some())
        })
        .await;
    assert_ne!(container_status(&again, "app").container_id, container_status(&first, "app").container_id);
    let ready = c.cri_states(&uid(&pod)).await.0;
    assert_eq!(
        ready.iter().filter(|s| **s == k8s_cri::v1::PodSandboxState::SandboxReady as i32).count(),
        1,
        "one ready sandbox: {ready:?}"
    );
    let events = c.events_of(&pod).await;
    assert!(events.iter().any(|e| e.reason.as_deref() == Some("SandboxChanged")), "a SandboxChanged event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_image_replaces_the_running_container() {
    let c = Cluster::start().await;
    let v2 = c.registry.push_image("busybox", "2.0", &busybox_image(Format::Oci)).await;
    let pod = c
        .create(json!({
            "metadata": {"name": "upgrade"},
            "spec": {"nodeName": "node-a", "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "app", "image": c.busybox, "command": ["sleep", "3600"]}]}
        }))
        .await;
    let first = c.wait_pod("upgrade", "Running", common::PATIENCE, |p| phase(p) == "Running").await;
    let patch = json!({"spec": {"containers": [{"name": "app", "image": v2.reference}]}});
    c.pods().patch("upgrade", &kube::api::PatchParams::default(), &kube::api::Patch::Strategic(&patch)).await.unwrap();
    let upgraded = c
        .wait_pod("upgrade", "the new image running", common::PATIENCE, |p| {
            let cs = container_status(p, "app");
            cs.image == v2.reference && cs.state.as_ref().is_some_and(|s| s.running.is_some())
        })
        .await;
    let cs = container_status(&upgraded, "app");
    assert_ne!(cs.container_id, container_status(&first, "app").container_id);
    assert_eq!(cs.restart_count, 1);
    let events = c.events_of(&pod).await;
    assert!(
        events.iter().any(|e| e.message.as_deref() == Some("Container app definition changed, will be restarted")),
        "a Killing event saying why"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_runs_beside_the_containers_and_ends_with_them() {
    let c = Cluster::start().await;
    let pod = c
        .create(json!({
            "metadata": {"name": "sidecar"},
            "spec": {"nodeName": "node-a", "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "initContainers": [{"name": "proxy", "image": c.busybox, "restartPolicy": "Always",
                        "command": ["sh", "-c", "echo up > /shared/proxy; exec sleep 3600"],
                        "volumeMounts": [{"name": "shared", "mountPath": "/shared"}]}],
                     "containers": [{"name": "app", "image": c.busybox,
                        "command": ["sh", "-c", "cat /shared/proxy; sleep 1"],
                        "volumeMounts": [{"name": "shared", "mountPath": "/shared"}]}],
                     "volumes": [{"name": "shared", "emptyDir": {}}]}
        }))
        .await;
    let running = c
        .wait_pod("sidecar", "both running", common::PATIENCE, |p| {
            phase(p) == "Running" && condition(p, "Ready").is_some_and(|c| c.status == "True")
        })
        .await;
    let proxy = &running.status.as_ref().unwrap().init_container_statuses.as_ref().unwrap()[0];
    assert!(proxy.state.as_ref().unwrap().running.is_some() && proxy.ready, "{proxy:?}");
    let done = c.wait_pod("sidecar", "Succeeded", common::PATIENCE, |p| phase(p) == "Succeeded").await;
    let log = c.agents[0].log_dir().join(format!("default_sidecar_{}", uid(&pod))).join("app/0.log");
    assert_eq!(log_text(&log), "up", "the sidecar ran before the container");
    common::eventually("the sidecar stopped with the pod", || async {
        let (sandboxes, containers) = c.cri_states(&uid(&done)).await;
        let exited = k8s_cri::v1::ContainerState::ContainerExited as i32;
        (sandboxes == vec![k8s_cri::v1::PodSandboxState::SandboxNotready as i32] && containers == vec![exited, exited])
            .then_some(())
    })
    .await;
}
