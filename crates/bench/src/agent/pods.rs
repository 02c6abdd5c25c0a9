//! The bench's pods through the API: their spec, the watch that sees them reach Running, one timed
//! start, and deleting them all again.
//!
//! "Running" is what a user waiting for a pod waits for: `status.phase` Running with every
//! container's `state.running` set, as the bench's own watch delivers it. The time of a start is
//! taken from just before the create call to the arrival of that watch event. A start whose
//! container fails at first (seen as a restart, an error's back-off or a Failed pod) ends there:
//! it is counted apart, and its eventual Running, after the agent's back-off, is not waited for.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;

/// The label every bench pod carries, for the watch and the clean-up.
pub const SELECTOR: &str = "app=berth-bench";
/// How long one pod may take to be seen Running or failing (gVisor on a busy machine included).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the deletion of a handler's pods may take.
const DELETE_TIMEOUT: Duration = Duration::from_secs(300);

/// A bench pod: bound to `node`, class `handler`, one busybox container sleeping, BestEffort
/// unless it requests `cpu`. The grace period is 1 s: `sleep` as pid 1 ignores SIGTERM, so
/// deletion costs that second, in parallel.
pub fn pod(name: &str, node: &str, handler: &str, image: &str, cpu: Option<&str>) -> anyhow::Result<Pod> {
    let resources = match cpu {
        Some(cpu) => serde_json::json!({"requests": {"cpu": cpu}}),
        None => serde_json::json!({}),
    };
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app": "berth-bench", "handler": handler}},
        "spec": {
            "nodeName": node,
            "runtimeClassName": handler,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app",
                "image": image,
                // The image is present (pulled before the run): a `:latest` tag would default to Always.
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
                "resources": resources,
            }],
        },
    }))?)
}

/// Whether the pod counts as started: phase Running, every container running.
pub fn is_running(pod: &Pod) -> bool {
    let Some(status) = &pod.status else { return false };
    let containers = status.container_statuses.as_deref().unwrap_or_default();
    status.phase.as_deref() == Some("Running")
        && !containers.is_empty()
        && containers.iter().all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

/// How a pod's start ended, as the watch saw it.
#[derive(Clone, Debug, PartialEq)]
pub enum Ended {
    Running,
    /// Its first container start failed (the runtime's or the image's error): what the status says.
    Failed(String),
}

/// Whether a pod's start has ended, and how: Running ([`is_running`]) without a restart, or
/// failed — a container that ended before running (`lastState` set, restarted) or waits for an
/// error's back-off, or the pod Failed. `None` while it is still starting.
pub fn start_ended(pod: &Pod) -> Option<Ended> {
    let status = pod.status.as_ref()?;
    let containers = status.container_statuses.as_deref().unwrap_or_default();
    for c in containers {
        let terminated = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
        if let Some(t) = terminated {
            return Some(Ended::Failed(t.message.clone().or(t.reason.clone()).unwrap_or_default()));
        }
        let waiting = c.state.as_ref().and_then(|s| s.waiting.as_ref());
        let reason = waiting.and_then(|w| w.reason.as_deref()).unwrap_or_default();
        if c.restart_count > 0 || FAILED_WAITING.contains(&reason) {
            let message = waiting.and_then(|w| w.message.clone()).unwrap_or_default();
            return Some(Ended::Failed(format!("{reason}: {message}")));
        }
    }
    if status.phase.as_deref() == Some("Failed") {
        return Some(Ended::Failed(format!("pod Failed: {}", status.message.clone().unwrap_or_default())));
    }
    is_running(pod).then_some(Ended::Running)
}

/// Waiting reasons kubelet gives a container that could not start.
const FAILED_WAITING: [&str; 7] = [
    "CrashLoopBackOff",
    "RunContainerError",
    "CreateContainerError",
    "CreateContainerConfigError",
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
];

/// A pod's start as the watch saw it end.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: Instant,
    pub ended: Ended,
}

/// What the watch tells of a pod.
enum Note {
    /// The first event of the pod: it was just created (a Deployment's pods have no create call
    /// of the bench's to time from).
    Appeared(String, Instant),
    Ended(String, Seen),
}

/// The start of every bench pod in the namespace, as one watch sees it end: kept by name
/// until asked for, so pods started together are all accounted for.
pub struct StartWatch {
    events: mpsc::UnboundedReceiver<Note>,
    seen: HashMap<String, Seen>,
    appeared: HashMap<String, Instant>,
    task: tokio::task::JoinHandle<()>,
}

impl StartWatch {
    /// Starts the watch and returns once its initial list is done, so no start is seen late.
    pub async fn start(api: Api<Pod>) -> anyhow::Result<Self> {
        let (tx, events) = mpsc::unbounded_channel();
        let (listed_tx, listed) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let stream = watcher::watcher(api, watcher::Config::default().labels(SELECTOR));
            futures::pin_mut!(stream);
            let mut listed_tx = Some(listed_tx);
            let (mut appeared, mut reported) = (std::collections::HashSet::new(), std::collections::HashSet::new());
            while let Some(event) = stream.next().await {
                let at = Instant::now();
                match event {
                    Ok(Event::Apply(p) | Event::InitApply(p)) => {
                        let (uid, name) = (p.metadata.uid.clone().unwrap_or_default(), p.metadata.name.clone());
                        let name = name.unwrap_or_default();
                        if appeared.insert(uid.clone()) {
                            let _ = tx.send(Note::Appeared(name.clone(), at));
                        }
                        let Some(ended) = start_ended(&p) else { continue };
                        if reported.insert(uid) {
                            let _ = tx.send(Note::Ended(name, Seen { at, ended }));
                        }
                    }
                    Ok(Event::InitDone) => {
                        if let Some(l) = listed_tx.take() {
                            let _ = l.send(());
                        }
                    }
                    Ok(_) => {}
                    Err(e) => eprintln!("pod watch: {e}; retrying"),
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(30), listed)
            .await
            .context("the pod watch did not list within 30 s")?
            .context("the pod watch ended")?;
        Ok(Self { events, seen: HashMap::new(), appeared: HashMap::new(), task })
    }

    /// Waits until the starts of `count` pods whose names `matches` have ended, or the deadline;
    /// returns those seen (name and end), taken out of the watch's keeping.
    pub async fn wait(
        &mut self,
        matches: impl Fn(&str) -> bool,
        count: usize,
        deadline: Instant,
    ) -> anyhow::Result<Vec<(String, Seen)>> {
        loop {
            let found = self.seen.keys().filter(|n| matches(n)).count();
            if found >= count {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.events.recv()).await {
                Ok(Some(Note::Ended(name, seen))) => {
                    self.seen.insert(name, seen);
                }
                Ok(Some(Note::Appeared(name, at))) => {
                    self.appeared.insert(name, at);
                }
                Ok(None) => bail!("the pod watch ended"),
                Err(_) => break,
            }
        }
        let names: Vec<String> = self.seen.keys().filter(|n| matches(n)).cloned().collect();
        self.appeared.retain(|n, _| !matches(n) || names.contains(n));
        Ok(names.into_iter().filter_map(|n| self.seen.remove(&n).map(|s| (n, s))).collect())
    }

    /// When the watch first saw pod `name` (taken out of its keeping).
    pub fn appeared(&mut self, name: &str) -> Option<Instant> {
        self.appeared.remove(name)
    }
}

impl StartWatch {
    /// The end of `name`'s start, or `None` at the deadline.
    async fn wait_for(&mut self, name: &str, deadline: Instant) -> anyhow::Result<Option<Seen>> {
        Ok(self.wait(|n| n == name, 1, deadline).await?.pop().map(|(_, seen)| seen))
    }
}

impl Drop for StartWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One pod start as the bench saw it.
#[derive(Clone, Debug)]
pub struct Start {
    pub uid: String,
    /// Wall-clock time just before the create call, to line the start up with daemon logs.
    pub at: std::time::SystemTime,
    /// The create call's round trip.
    pub create: Duration,
    /// From just before the create call to the watch event showing the start's end.
    pub took: Duration,
    /// `Running`, or why not: a failed start is left to the agent and the clean-up.
    pub ended: Ended,
    /// Neither Running nor failed within [`START_TIMEOUT`].
    pub timed_out: bool,
}

/// Creates `pod` and waits for the watch to see its start end: Running, failed, or not ended
/// within [`START_TIMEOUT`] (then a failure saying where it is stuck).
pub async fn start(api: &Api<Pod>, watch: &mut StartWatch, pod: &Pod) -> anyhow::Result<Start> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let (at, t0) = (std::time::SystemTime::now(), Instant::now());
    let created = api.create(&PostParams::default(), pod).await.with_context(|| format!("creating pod {name}"))?;
    let create = t0.elapsed();
    let uid = created.metadata.uid.unwrap_or_default();
    let seen = watch.wait_for(&name, t0 + START_TIMEOUT).await?;
    let timed_out = seen.is_none();
    let (took, ended) = match seen {
        Some(seen) => (seen.at.saturating_duration_since(t0), seen.ended),
        None => {
            let status = api.get_opt(&name).await?.and_then(|p| p.status);
            let phase = status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
            let reason = format!("not Running within {START_TIMEOUT:?} (phase {phase:?})");
            (t0.elapsed(), Ended::Failed(reason))
        }
    };
    Ok(Start { uid, at, create, took, ended, timed_out })
}

/// Deletes every bench pod (gracefully: the agent stops and removes them, then the object goes)
/// and waits until the API has none left. Returns how many there were.
pub async fn delete_all(api: &Api<Pod>) -> anyhow::Result<usize> {
    let selector = ListParams::default().labels(SELECTOR);
    let pods = api.list(&selector).await?.items;
    for p in &pods {
        let name = p.metadata.name.as_deref().unwrap_or_default();
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("deleting pod {name}")),
        }
    }
    let deadline = Instant::now() + DELETE_TIMEOUT;
    loop {
        let left = api.list(&selector).await?.items.len();
        if left == 0 {
            return Ok(pods.len());
        }
        if Instant::now() > deadline {
            bail!("{left} pod(s) still in the API {DELETE_TIMEOUT:?} after their deletion");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_status(status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "status": status})).unwrap()
    }

    #[test]
    fn a_pod_counts_as_started_only_when_running_with_every_container_running() {
        let running = serde_json::json!({"running": {"startedAt": "2025-01-01T00:00:00Z"}});
        let waiting = serde_json::json!({"waiting": {"reason": "ContainerCreating"}});
        let status = |phase: &str, states: &[&serde_json::Value]| {
            let containers: Vec<_> = states
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    serde_json::json!({"name": format!("c{i}"), "image": "i", "imageID": "", "ready": true,
                                       "restartCount": 0, "state": s})
                })
                .collect();
            with_status(serde_json::json!({"phase": phase, "containerStatuses": containers}))
        };
        assert!(is_running(&status("Running", &[&running, &running])));
        assert_eq!(start_ended(&status("Running", &[&running, &running])), Some(Ended::Running));
        assert_eq!(start_ended(&status("Pending", &[&waiting])), None);
        assert!(!is_running(&status("Running", &[&running, &waiting])));
        assert!(!is_running(&status("Pending", &[&running])));
        assert!(!is_running(&status("Running", &[])));
        assert!(!is_running(&with_status(serde_json::json!({}))));
    }

    #[test]
    fn a_failed_first_start_ends_the_start_with_the_runtimes_message() {
        let restarted = with_status(serde_json::json!({"phase": "Running", "containerStatuses": [{
            "name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 1,
            "state": {"running": {}},
            "lastState": {"terminated": {"exitCode": 128, "reason": "StartError", "message": "monitor setup failed"}},
        }]}));
        assert_eq!(start_ended(&restarted), Some(Ended::Failed("monitor setup failed".into())));
        let backing_off = with_status(serde_json::json!({"phase": "Pending", "containerStatuses": [{
            "name": "app", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}},
        }]}));
        assert_eq!(start_ended(&backing_off), Some(Ended::Failed("ErrImagePull: not found".into())));
        let failed = with_status(serde_json::json!({"phase": "Failed", "message": "RuntimeClass \"x\" not found"}));
        assert!(matches!(start_ended(&failed), Some(Ended::Failed(m)) if m.contains("RuntimeClass")));
    }

    #[test]
    fn the_bench_pod_is_bound_classed_and_uses_the_present_image() {
        let p = pod("runc-1", "node-a", "runc", "127.0.0.1:5000/busybox:latest", None).unwrap();
        let spec = p.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(spec.runtime_class_name.as_deref(), Some("runc"));
        assert_eq!(spec.containers[0].image_pull_policy.as_deref(), Some("IfNotPresent"));
        assert_eq!(p.metadata.labels.unwrap()["app"], "berth-bench");
    }
}
