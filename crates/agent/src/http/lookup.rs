//! Finds a pod's sandbox and containers through CRI, by kubelet's standard labels: on the endpoint
//! the runtime manager remembers for the pod's UID, or else on every endpoint.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_cri::v1 as cri;

use crate::endpoint::Endpoint;
use crate::runtimes::RuntimeManager;

pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";

/// A pod's sandbox and the endpoint that runs it.
#[derive(Clone, Debug)]
pub struct FoundPod {
    pub endpoint: Arc<Endpoint>,
    pub sandbox: cri::PodSandbox,
    pub uid: String,
}

impl FoundPod {
    pub fn is_ready(&self) -> bool {
        self.sandbox.state == cri::PodSandboxState::SandboxReady as i32
    }
}

/// Which of a container's instances a request means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Instance {
    /// The latest attempt, running or not (logs).
    Latest,
    /// The attempt before the latest (`previous=true`).
    Previous,
    /// The latest attempt, which must be running (exec, attach).
    Running,
}

/// Why a pod or container could not be found.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("pod {pod:?} does not exist")]
    PodNotFound { pod: String },
    /// kubelet's message when exec or attach finds no running container.
    #[error("container not found ({container:?})")]
    ContainerNotRunning { container: String },
    #[error("previous terminated container {container:?} in pod {pod:?} not found")]
    NoPrevious { container: String, pod: String },
    #[error("container {container:?} in pod {pod:?} is waiting to start: {reason}")]
    Waiting { container: String, pod: String, reason: String },
    #[error("runtime {endpoint} failed")]
    Runtime {
        endpoint: String,
        #[source]
        status: tonic::Status,
    },
}

impl LookupError {
    /// The message for the client, with the runtime's own message when it failed.
    pub fn message(&self) -> String {
        match self {
            LookupError::Runtime { endpoint, status } => format!("runtime {endpoint} failed: {}", status.message()),
            other => other.to_string(),
        }
    }

    /// The HTTP code kubelet answers with.
    pub fn status_code(&self) -> u16 {
        match self {
            LookupError::PodNotFound { .. } => 404,
            LookupError::NoPrevious { .. } | LookupError::Waiting { .. } => 400,
            LookupError::ContainerNotRunning { .. } | LookupError::Runtime { .. } => 500,
        }
    }
}

fn runtime_error(endpoint: &Endpoint) -> impl FnOnce(tonic::Status) -> LookupError + '_ {
    move |status| LookupError::Runtime { endpoint: endpoint.name.clone(), status }
}

/// The sandbox of pod `namespace/name` (with `uid` when known): the ready one, else the latest.
pub async fn find_pod(
    runtimes: &RuntimeManager,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
) -> Result<FoundPod, LookupError> {
    let endpoints: Vec<Arc<Endpoint>> = match uid.and_then(|u| runtimes.endpoint_of(u)) {
        Some(endpoint) => vec![endpoint],
        None => runtimes.endpoints().into_iter().map(|(e, _)| e).collect(),
    };
    let mut labels = HashMap::from([
        (POD_NAME_LABEL.to_string(), name.to_string()),
        (POD_NAMESPACE_LABEL.to_string(), namespace.to_string()),
    ]);
    if let Some(uid) = uid {
        labels.insert(POD_UID_LABEL.into(), uid.into());
    }
    let mut found: Vec<(Arc<Endpoint>, cri::PodSandbox)> = Vec::new();
    let mut failure = None;
    for endpoint in &endpoints {
        let filter = cri::PodSandboxFilter { label_selector: labels.clone(), ..Default::default() };
        let mut client = endpoint.runtime.clone();
        match client.list_pod_sandbox(cri::ListPodSandboxRequest { filter: Some(filter) }).await {
            Ok(list) => found.extend(list.into_inner().items.into_iter().map(|s| (endpoint.clone(), s))),
            Err(status) => {
                tracing::debug!(endpoint = %endpoint.name, error = %status, "listing sandboxes failed");
                failure = Some(runtime_error(endpoint)(status));
            }
        }
    }
    if found.is_empty() {
        // Sandboxes made without kubelet's labels (crictl, older agents) still carry metadata.
        for endpoint in &endpoints {
            let mut client = endpoint.runtime.clone();
            let Ok(list) = client.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None }).await else {
                continue;
            };
            found.extend(
                list.into_inner()
                    .items
                    .into_iter()
                    .filter(|s| {
                        s.metadata.as_ref().is_some_and(|m| {
                            m.name == name && m.namespace == namespace && uid.is_none_or(|u| m.uid == u)
                        })
                    })
                    .map(|s| (endpoint.clone(), s)),
            );
        }
    }
    let Some((endpoint, sandbox)) = found.into_iter().max_by_key(|(_, s)| sandbox_rank(s)) else {
        return Err(match failure {
            Some(err) if endpoints.len() == 1 => err,
            _ => LookupError::PodNotFound { pod: name.to_string() },
        });
    };
    let uid = sandbox
        .labels
        .get(POD_UID_LABEL)
        .cloned()
        .or_else(|| sandbox.metadata.as_ref().map(|m| m.uid.clone()))
        .unwrap_or_default();
    Ok(FoundPod { endpoint, sandbox, uid })
}

/// Ready sandboxes first, then the latest attempt.
fn sandbox_rank(s: &cri::PodSandbox) -> (bool, u32, i64) {
    let ready = s.state == cri::PodSandboxState::SandboxReady as i32;
    (ready, s.metadata.as_ref().map_or(0, |m| m.attempt), s.created_at)
}

/// The container named `container` of the pod, as `instance` asks. `waiting_reason` (from the
/// pod's status in the API, when known) explains a container that has not started yet.
pub async fn find_container(
    pod: &FoundPod,
    pod_name: &str,
    container: &str,
    instance: Instance,
    waiting_reason: Option<&str>,
) -> Result<cri::Container, LookupError> {
    let mut client = pod.endpoint.runtime.clone();
    let mut containers = Vec::new();
    if !pod.uid.is_empty() {
        // Every attempt of the container, also those of the pod's earlier sandboxes.
        let labels = HashMap::from([
            (POD_UID_LABEL.to_string(), pod.uid.clone()),
            (CONTAINER_NAME_LABEL.to_string(), container.to_string()),
        ]);
        let filter = cri::ContainerFilter { label_selector: labels, ..Default::default() };
        let list = client
            .list_containers(cri::ListContainersRequest { filter: Some(filter) })
            .await
            .map_err(runtime_error(&pod.endpoint))?;
        containers = list.into_inner().containers;
    }
    if containers.is_empty() {
        let filter = cri::ContainerFilter { pod_sandbox_id: pod.sandbox.id.clone(), ..Default::default() };
        let list = client
            .list_containers(cri::ListContainersRequest { filter: Some(filter) })
            .await
            .map_err(runtime_error(&pod.endpoint))?;
        containers = list.into_inner().containers.into_iter().filter(|c| metadata_name(c) == Some(container)).collect();
    }
    choose_container(containers, pod_name, container, instance, waiting_reason)
}

fn metadata_name(c: &cri::Container) -> Option<&str> {
    c.metadata.as_ref().map(|m| m.name.as_str())
}

/// Picks the instance among a container's attempts (pure, for tests).
pub fn choose_container(
    mut attempts: Vec<cri::Container>,
    pod_name: &str,
    container: &str,
    instance: Instance,
    waiting_reason: Option<&str>,
) -> Result<cri::Container, LookupError> {
    attempts.sort_by_key(|c| std::cmp::Reverse((c.metadata.as_ref().map_or(0, |m| m.attempt), c.created_at)));
    let mut attempts = attempts.into_iter();
    match instance {
        Instance::Latest => attempts.next().ok_or_else(|| LookupError::Waiting {
            container: container.into(),
            pod: pod_name.into(),
            reason: waiting_message(waiting_reason),
        }),
        Instance::Previous => {
            attempts.nth(1).ok_or_else(|| LookupError::NoPrevious { container: container.into(), pod: pod_name.into() })
        }
        Instance::Running => attempts
            .next()
            .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
            .ok_or_else(|| LookupError::ContainerNotRunning { container: container.into() }),
    }
}

/// kubelet's wording for the common reasons a container has not started.
fn waiting_message(reason: Option<&str>) -> String {
    match reason.filter(|r| !r.is_empty()) {
        Some("ErrImagePull") => "image can't be pulled".into(),
        Some("ImagePullBackOff") => "trying and failing to pull image".into(),
        Some(other) => other.into(),
        None => "ContainerCreating".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(id: &str, n: u32, state: cri::ContainerState) -> cri::Container {
        cri::Container {
            id: id.into(),
            metadata: Some(cri::ContainerMetadata { name: "app".into(), attempt: n }),
            state: state as i32,
            created_at: i64::from(n),
            ..Default::default()
        }
    }

    fn attempts() -> Vec<cri::Container> {
        vec![
            attempt("a0", 0, cri::ContainerState::ContainerExited),
            attempt("a2", 2, cri::ContainerState::ContainerRunning),
            attempt("a1", 1, cri::ContainerState::ContainerExited),
        ]
    }

    #[test]
    fn the_latest_attempt_is_current_and_the_one_before_is_previous() {
        let pick = |i| choose_container(attempts(), "web", "app", i, None).unwrap().id;
        assert_eq!(pick(Instance::Latest), "a2");
        assert_eq!(pick(Instance::Previous), "a1");
        assert_eq!(pick(Instance::Running), "a2");
    }

    #[test]
    fn a_container_that_never_restarted_has_no_previous() {
        let one = vec![attempt("a0", 0, cri::ContainerState::ContainerRunning)];
        let err = choose_container(one, "web", "app", Instance::Previous, None).unwrap_err();
        assert_eq!(err.to_string(), "previous terminated container \"app\" in pod \"web\" not found");
        assert_eq!(err.status_code(), 400);
    }

    #[test]
    fn exec_needs_the_latest_attempt_running() {
        let exited = vec![attempt("a0", 0, cri::ContainerState::ContainerExited)];
        let err = choose_container(exited, "web", "app", Instance::Running, None).unwrap_err();
        assert_eq!(err.to_string(), "container not found (\"app\")");
    }

    #[test]
    fn a_container_not_started_yet_says_why_as_kubelet_does() {
        let err = choose_container(vec![], "web", "app", Instance::Latest, Some("ImagePullBackOff")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "container \"app\" in pod \"web\" is waiting to start: trying and failing to pull image"
        );
        let err = choose_container(vec![], "web", "app", Instance::Latest, None).unwrap_err();
        assert_eq!(err.to_string(), "container \"app\" in pod \"web\" is waiting to start: ContainerCreating");
    }

    #[test]
    fn a_ready_sandbox_wins_over_a_later_one_that_is_not() {
        let sandbox = |id: &str, attempt, ready: bool| cri::PodSandbox {
            id: id.into(),
            metadata: Some(cri::PodSandboxMetadata { attempt, ..Default::default() }),
            state: if ready { cri::PodSandboxState::SandboxReady } else { cri::PodSandboxState::SandboxNotready }
                as i32,
            ..Default::default()
        };
        let all = [sandbox("s0", 0, true), sandbox("s1", 1, false)];
        assert_eq!(all.iter().max_by_key(|s| sandbox_rank(s)).unwrap().id, "s0");
        let all = [sandbox("s0", 0, false), sandbox("s1", 1, false)];
        assert_eq!(all.iter().max_by_key(|s| sandbox_rank(s)).unwrap().id, "s1");
    }
}
