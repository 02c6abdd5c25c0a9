//! The labels and annotations kubelet puts on sandboxes and containers, by which the agent (after
//! a restart) and its HTTPS API find a pod's sandbox and containers in any CRI runtime.

use std::collections::HashMap;

pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// kubelet marks its sandboxes with `io.kubernetes.docker.type=podsandbox` only for dockershim;
/// CRI runtimes tell sandboxes and containers apart themselves, so no type label is needed.
pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
pub const CONTAINER_TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
pub const CONTAINER_TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";
pub const CONTAINER_PRE_STOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";
pub const CONTAINER_PORTS: &str = "io.kubernetes.container.ports";
pub const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
/// berth's own: the host file mounted at the container's termination message path, read when it exits.
pub const CONTAINER_TERMINATION_MESSAGE_FILE: &str = "berth.dev/termination-message-file";
/// berth's own: `init` for init containers, so status and recovery can tell them apart by name
/// even when the pod object is gone.
pub const CONTAINER_KIND: &str = "berth.dev/container-kind";

/// berth's own label: the node whose agent made the sandbox or container, so that agents sharing
/// a runtime (several on one host) each recover and collect only their own pods.
pub const NODE: &str = "berth.dev/node";

/// The labels every sandbox of the pod carries: the pod's own labels plus the standard three.
pub fn sandbox_labels(
    pod_labels: Option<&std::collections::BTreeMap<String, String>>,
    name: &str,
    namespace: &str,
    uid: &str,
) -> HashMap<String, String> {
    let mut labels: HashMap<String, String> =
        pod_labels.map(|l| l.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default();
    labels.insert(POD_NAME.into(), name.into());
    labels.insert(POD_NAMESPACE.into(), namespace.into());
    labels.insert(POD_UID.into(), uid.into());
    labels
}

/// The labels of one container: the standard four, exactly as kubelet sets them.
pub fn container_labels(container: &str, name: &str, namespace: &str, uid: &str) -> HashMap<String, String> {
    HashMap::from([
        (CONTAINER_NAME.to_string(), container.to_string()),
        (POD_NAME.to_string(), name.to_string()),
        (POD_NAMESPACE.to_string(), namespace.to_string()),
        (POD_UID.to_string(), uid.to_string()),
    ])
}

/// The pod UID a sandbox or container belongs to, if it was created by a kubelet-like agent.
pub fn pod_uid(labels: &HashMap<String, String>) -> Option<&str> {
    labels.get(POD_UID).map(String::as_str).filter(|u| !u.is_empty())
}

/// The restart count recorded on a container (0 when absent or unreadable).
pub fn restart_count(annotations: &HashMap<String, String>) -> i32 {
    annotations.get(CONTAINER_RESTART_COUNT).and_then(|c| c.parse().ok()).unwrap_or(0)
}
