//! Crash safety of running containers, end to end: `kill -9` of the real `berth runtime` while 20
//! containers run under runc and gVisor must leave every one of them running and logging (their
//! `berth-monitor`s own them, not the runtime); an exit during the downtime must be found on
//! restart with its code; the restarted runtime must list exactly what the killed one did; and
//! removing everything afterwards must leave nothing behind on the host.
//!
//! Needs root, runc, runsc and the CNI plugins, and fails (never skips) without them.

mod common_cri;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use berth_testenv::Registry;
use berth_testenv::images::{Format, busybox_image};
use common_cri::{RemovePodsOnPanic, Runtime};
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

/// 10 pods of 2 containers: even pods on runc, odd ones on gVisor.
const PODS: usize = 10;
const HANDLERS: [&str; 2] = ["runc", "gvisor"];
/// The pod and container (by name) that exits while the runtime is down.
const DOOMED: (usize, &str) = (0, "b");
const DOOMED_EXIT_CODE: i32 = 42;
/// The longest silence allowed between two counter lines of one log (they come every 100 ms).
const MAX_GAP_NS: i64 = 2_000_000_000;
/// How long the runtime stays down at least, so that every log must grow meanwhile.
const DOWNTIME: Duration = Duration::from_millis(1500);

/// Counts every 100 ms until told to stop; `trap` so that StopContainer needs no SIGKILL (the shell
/// is pid 1, which ignores an unhandled SIGTERM).
const TICKER: &str = "trap 'exit 0' TERM; i=0; while true; do echo \"tick $i\"; i=$((i+1)); sleep 0.1; done";
/// As [`TICKER`], but exits 42 once the host creates `/trigger/exit`: the test decides exactly
/// when (during the downtime) instead of racing a `sleep`.
const DOOMED_SCRIPT: &str =
    "trap 'exit 0' TERM; i=0; while [ ! -e /trigger/exit ]; do echo \"tick $i\"; i=$((i+1)); sleep 0.1; done; exit 42";

fn now_ns() -> i64 {
    jiff::Timestamp::now().as_nanosecond() as i64
}

/// Panics unless everything the scenario runs is installed: tests fail, never skip.
fn require_prerequisites() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let uid = status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|l| l.split_whitespace().nth(1));
    assert_eq!(uid, Some("0"), "this test runs containers and must run as root");
    let path = std::env::var_os("PATH").unwrap_or_default();
    for bin in ["runc", "runsc"] {
        assert!(std::env::split_paths(&path).any(|d| d.join(bin).is_file()), "{bin} is not on PATH");
    }
    for plugin in ["bridge", "host-local", "loopback"] {
        assert!(
            ["/usr/lib/cni", "/opt/cni/bin"].iter().any(|d| Path::new(d).join(plugin).is_file()),
            "the CNI plugin {plugin} is missing (Debian package containernetworking-plugins)"
        );
    }
}

/// One container of the scenario.
#[derive(Debug, Clone)]
struct Ctr {
    id: String,
    pod: usize,
    name: String,
    log: PathBuf,
}

impl Ctr {
    fn doomed(&self) -> bool {
        (self.pod, self.name.as_str()) == (DOOMED.0, DOOMED.1)
    }
}

fn pod_config(i: usize, logs: &Path) -> cri::PodSandboxConfig {
    let name = format!("crash-{i}");
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.clone(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.clone(),
        log_directory: logs.join(&name).to_string_lossy().into_owned(),
        ..Default::default()
    }
}

fn container_config(name: &str, image: &str, script: &str) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata { name: name.into(), attempt: 0 }),
        image: Some(cri::ImageSpec { image: image.into(), ..Default::default() }),
        command: vec!["sh".into(), "-c".into(), script.into()],
        log_path: format!("{name}.log"),
        ..Default::default()
    }
}

/// Runs pod `i` on its handler with containers `a` and `b`, both started; returns the pod's id
/// and its containers.
async fn run_pod(channel: Channel, i: usize, image: String, logs: PathBuf, trigger: PathBuf) -> (String, Vec<Ctr>) {
    let mut c = RuntimeServiceClient::new(channel);
    let pod = pod_config(i, &logs);
    let handler = HANDLERS[i % 2];
    let sandbox = c
        .run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(pod.clone()), runtime_handler: handler.into() })
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox {i} ({handler}): {e}"))
        .into_inner()
        .pod_sandbox_id;
    let mut ctrs = Vec::new();
    for name in ["a", "b"] {
        let mut config = container_config(name, &image, TICKER);
        if (i, name) == (DOOMED.0, DOOMED.1) {
            config.command[2] = DOOMED_SCRIPT.into();
            config.mounts.push(cri::Mount {
                container_path: "/trigger".into(),
                host_path: trigger.to_string_lossy().into_owned(),
                ..Default::default()
            });
        }
        let id = c
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox.clone(),
                config: Some(config),
                sandbox_config: Some(pod.clone()),
            })
            .await
            .unwrap_or_else(|e| panic!("CreateContainer {i}/{name} ({handler}): {e}"))
            .into_inner()
            .container_id;
        c.start_container(cri::StartContainerRequest { container_id: id.clone() })
            .await
            .unwrap_or_else(|e| panic!("StartContainer {i}/{name} ({handler}): {e}"));
        let log = Path::new(&pod.log_directory).join(format!("{name}.log"));
        ctrs.push(Ctr { id, pod: i, name: name.into(), log });
    }
    (sandbox, ctrs)
}

async fn list_pods(c: &mut RuntimeServiceClient<Channel>) -> Vec<cri::PodSandbox> {
    let mut pods = c.list_pod_sandbox(cri::ListPodSandboxRequest::default()).await.unwrap().into_inner().items;
    pods.sort_by(|a, b| a.id.cmp(&b.id));
    pods
}

async fn list_containers(c: &mut RuntimeServiceClient<Channel>) -> Vec<cri::Container> {
    let mut ctrs = c.list_containers(cri::ListContainersRequest::default()).await.unwrap().into_inner().containers;
    ctrs.sort_by(|a, b| a.id.cmp(&b.id));
    ctrs
}

/// A container's status and, from the verbose info, its process and its monitor's pids.
async fn status(c: &mut RuntimeServiceClient<Channel>, id: &str) -> (cri::ContainerStatus, i32, i32) {
    let resp = c
        .container_status(cri::ContainerStatusRequest { container_id: id.into(), verbose: true })
        .await
        .unwrap()
        .into_inner();
    let info: serde_json::Value = serde_json::from_str(&resp.info["info"]).unwrap();
    let pid = |key: &str| info[key].as_i64().unwrap_or_else(|| panic!("no {key} in {info}")) as i32;
    (resp.status.unwrap(), pid("pid"), pid("monitorPid"))
}

/// Alive and not a zombie.
fn alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state follows the parenthesised command name, which may itself hold spaces.
    stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()).is_some_and(|s| s != "Z")
}

/// The log's `(timestamp ns, counter)` lines; panics on anything else.
fn ticks(log: &Path) -> Vec<(i64, u64)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(|line| {
            let parse = || {
                let mut parts = line.splitn(4, ' ');
                let ts: jiff::Timestamp = parts.next()?.parse().ok()?;
                let (stream, tag, content) = (parts.next()?, parts.next()?, parts.next()?);
                let n = content.strip_prefix("tick ")?.parse().ok()?;
                ((stream, tag) == ("stdout", "F")).then_some((ts.as_nanosecond() as i64, n))
            };
            parse().unwrap_or_else(|| panic!("unexpected line in {}: {line:?}", log.display()))
        })
        .collect()
}

/// Processes whose command line mentions any of `ids` (monitors, runsc sandboxes and gofers…).
fn processes_mentioning(ids: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if ids.iter().any(|id| cmdline.contains(id)) {
            found.push(format!("{}: {cmdline}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

/// Mounts and netns files on the host that mention any of `ids`, and processes that do.
fn leaks(ids: &[&str]) -> Vec<String> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut found: Vec<String> =
        mounts.lines().filter(|l| ids.iter().any(|id| l.contains(id))).map(|l| format!("mount: {l}")).collect();
    for id in ids {
        if Path::new("/run/berth/netns").join(id).exists() {
            found.push(format!("netns: {id}"));
        }
    }
    found.extend(processes_mentioning(ids).into_iter().map(|p| format!("process {p}")));
    found
}

/// Polls `f` until it is true, for at most `limit`.
async fn eventually(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_runc_and_gvisor_containers_survive_kill_9_of_the_runtime_and_an_exit_meanwhile_is_reported() {
    let t0 = Instant::now();
    require_prerequisites();
    let registry = Registry::start();
    registry.push_image("busybox", "latest", &busybox_image(Format::Oci)).await;
    let image = registry.reference("busybox:latest");
    let host = registry.host().to_string();
    let mut rt = tokio::task::spawn_blocking(move || {
        common_cri::ensure_monitor();
        Runtime::start_with_pods(&host, "berthcr0", "10.204.0.0/24")
    })
    .await
    .unwrap();
    let cleanup = RemovePodsOnPanic::new(&rt);
    let logs = rt.dir.path().join("logs");
    let trigger = rt.dir.path().join("trigger");
    std::fs::create_dir_all(&trigger).unwrap();
    let channel = rt.channel().await;
    let mut c = RuntimeServiceClient::new(channel.clone());
    let mut images = ImageServiceClient::new(channel.clone());
    for handler in HANDLERS {
        let spec = cri::ImageSpec { image: image.clone(), runtime_handler: handler.into(), ..Default::default() };
        images.pull_image(cri::PullImageRequest { image: Some(spec), ..Default::default() }).await.unwrap();
    }

    // Pods in parallel: gVisor takes a fraction of a second per container.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..PODS {
        tasks.spawn(run_pod(channel.clone(), i, image.clone(), logs.clone(), trigger.clone()));
    }
    let mut sandboxes = Vec::new();
    let mut ctrs = Vec::new();
    while let Some(done) = tasks.join_next().await {
        let (sandbox, mut pod_ctrs) = done.unwrap();
        sandboxes.push(sandbox);
        ctrs.append(&mut pod_ctrs);
    }
    ctrs.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(ctrs.len(), 2 * PODS);
    let started = t0.elapsed();
    // Every container has logged, so each is surely past its start when the runtime dies.
    eventually(Duration::from_secs(20), "a first tick in every log", || {
        ctrs.iter().all(|ctr| !ticks(&ctr.log).is_empty())
    })
    .await;

    let pods_before = list_pods(&mut c).await;
    let ctrs_before = list_containers(&mut c).await;
    assert_eq!(pods_before.len(), PODS);
    assert_eq!(ctrs_before.len(), 2 * PODS);
    assert!(pods_before.iter().all(|p| p.state == cri::PodSandboxState::SandboxReady as i32), "{pods_before:?}");
    assert!(ctrs_before.iter().all(|c| c.state == cri::ContainerState::ContainerRunning as i32), "{ctrs_before:?}");
    let mut before = BTreeMap::new();
    for ctr in &ctrs {
        let (s, pid, monitor) = status(&mut c, &ctr.id).await;
        assert!(pid > 0 && monitor > 0, "{}: pid {pid}, monitor {monitor}", ctr.id);
        before.insert(ctr.id.clone(), (s, pid, monitor));
    }
    drop((c, images, channel));

    tokio::task::block_in_place(|| rt.kill9());
    // Taken once the runtime is surely dead (kill9 reaps it).
    let killed_at = now_ns();
    let down = Instant::now();
    for ctr in &ctrs {
        let (_, pid, monitor) = before[&ctr.id];
        assert!(alive(pid) && alive(monitor), "{} ({pid}, monitor {monitor}) died with the runtime", ctr.id);
    }
    // The doomed container exits now, while nobody but its monitor watches, once it has logged
    // something during the downtime too.
    let doomed = ctrs.iter().find(|c| c.doomed()).unwrap().clone();
    eventually(Duration::from_secs(5), "a tick of the doomed container after the kill", || {
        ticks(&doomed.log).last().is_some_and(|(ts, _)| *ts > killed_at)
    })
    .await;
    std::fs::write(trigger.join("exit"), "").unwrap();
    let (_, doomed_pid, doomed_monitor) = before[&doomed.id];
    eventually(Duration::from_secs(10), "the doomed container and its monitor to exit", || {
        !alive(doomed_pid) && !alive(doomed_monitor)
    })
    .await;
    let mut still_running = true;
    for ctr in ctrs.iter().filter(|c| !c.doomed()) {
        let (_, pid, monitor) = before[&ctr.id];
        still_running &= alive(pid) && alive(monitor);
    }
    assert!(still_running, "a container other than the doomed one died during the downtime");
    tokio::time::sleep(DOWNTIME.saturating_sub(down.elapsed())).await;

    let restarted_at = now_ns();
    tokio::task::block_in_place(|| rt.restart());
    let mut c = RuntimeServiceClient::new(rt.channel().await);
    assert_eq!(list_pods(&mut c).await, pods_before, "pods after the restart");
    let mut ctrs_expected = ctrs_before.clone();
    for listed in ctrs_expected.iter_mut().filter(|l| l.id == doomed.id) {
        listed.state = cri::ContainerState::ContainerExited as i32;
    }
    assert_eq!(list_containers(&mut c).await, ctrs_expected, "containers after the restart");
    for ctr in &ctrs {
        let (s, pid, monitor) = status(&mut c, &ctr.id).await;
        let (old, old_pid, old_monitor) = &before[&ctr.id];
        if !ctr.doomed() {
            assert_eq!(&s, old, "status of {}", ctr.id);
            assert_eq!((pid, monitor), (*old_pid, *old_monitor), "pids of {}", ctr.id);
            continue;
        }
        assert_eq!(s.state, cri::ContainerState::ContainerExited as i32, "{s:?}");
        assert_eq!((s.exit_code, s.reason.as_str()), (DOOMED_EXIT_CODE, "Error"), "{s:?}");
        assert!(killed_at < s.finished_at && s.finished_at < restarted_at, "finished during the downtime: {s:?}");
        let expected = cri::ContainerStatus {
            state: s.state,
            finished_at: s.finished_at,
            exit_code: s.exit_code,
            reason: s.reason.clone(),
            message: s.message.clone(),
            ..old.clone()
        };
        assert_eq!(s, expected, "only the exit changed in the status of {}", ctr.id);
    }

    // Logs: every counter line there, in order, none silent for long, written during the
    // downtime, and (but for the doomed one) still written after the restart.
    let restarted = now_ns();
    eventually(Duration::from_secs(10), "ticks after the restart in every log", || {
        ctrs.iter().filter(|c| !c.doomed()).all(|c| ticks(&c.log).last().is_some_and(|(ts, _)| *ts > restarted))
    })
    .await;
    let doomed_finished = status(&mut c, &doomed.id).await.0.finished_at;
    for ctr in &ctrs {
        let ticks = ticks(&ctr.log);
        for (n, (_, counter)) in ticks.iter().enumerate() {
            assert_eq!(*counter, n as u64, "line {n} of {} (a line lost or repeated)", ctr.log.display());
        }
        for pair in ticks.windows(2) {
            let gap = pair[1].0 - pair[0].0;
            assert!(gap <= MAX_GAP_NS, "{} is silent for {gap} ns after tick {}", ctr.log.display(), pair[0].1);
        }
        let during = ticks.iter().filter(|(ts, _)| killed_at < *ts && *ts < restarted_at).count();
        assert!(during > 0, "{} got nothing while the runtime was down", ctr.log.display());
        if ctr.doomed() {
            let last = ticks.last().unwrap().0;
            assert!(last <= doomed_finished, "{} logs after its exit", ctr.log.display());
        }
    }

    // Stop and remove everything; nothing of it may be left on the host.
    for ctr in &ctrs {
        c.stop_container(cri::StopContainerRequest { container_id: ctr.id.clone(), timeout: 10 }).await.unwrap();
        let (s, _, _) = status(&mut c, &ctr.id).await;
        assert_eq!(s.state, cri::ContainerState::ContainerExited as i32, "{s:?}");
        c.remove_container(cri::RemoveContainerRequest { container_id: ctr.id.clone() }).await.unwrap();
    }
    for sandbox in &sandboxes {
        c.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: sandbox.clone() }).await.unwrap();
        c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sandbox.clone() }).await.unwrap();
    }
    assert_eq!(list_pods(&mut c).await, Vec::new());
    assert_eq!(list_containers(&mut c).await, Vec::new());
    let ids: Vec<&str> = sandboxes.iter().chain(ctrs.iter().map(|c| &c.id)).map(String::as_str).collect();
    let mut left = leaks(&ids);
    // Processes exit asynchronously after their kill; give them a moment.
    // gVisor containers' host side is removed in the background after RemoveContainer.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !left.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = leaks(&ids);
    }
    assert_eq!(left, Vec::<String>::new(), "left behind");
    drop((c, cleanup));
    tokio::task::block_in_place(|| rt.stop());
    eprintln!("{} containers started in {started:?}; whole test {:?}", ctrs.len(), t0.elapsed());
}
