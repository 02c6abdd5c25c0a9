//! A pod's status as Kubernetes reports it, computed from what the runtime says about its sandbox
//! and containers and what the worker knows (waiting reasons, probe results): phase, conditions,
//! IPs, container statuses. Pure: the caller supplies the observations and the time.

use std::collections::HashMap;

use jiff::Timestamp;
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::labels;
use super::plan::is_sidecar;

/// One container instance as the runtime reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct Instance {
    pub id: String,
    pub name: String,
    pub sandbox_id: String,
    pub restart_count: i32,
    pub state: InstanceState,
    pub created_at: Option<Timestamp>,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub exit_code: i32,
    /// The runtime's reason for an exit (`Completed`, `Error`, `OOMKilled`), may be empty.
    pub reason: String,
    pub message: String,
    /// The image the container was created from, as the user wrote it (`image` in the pod status).
    pub image: String,
    /// The image ID the container runs (`imageID` in the pod status).
    pub image_ref: String,
    pub annotations: HashMap<String, String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceState {
    Created,
    Running,
    Exited,
    Unknown,
}

/// Whole seconds: the API's precision, so that a re-read status compares equal.
pub fn timestamp_from_nanos(nanos: i64) -> Option<Timestamp> {
    (nanos > 0).then(|| Timestamp::from_second(nanos / 1_000_000_000).ok()).flatten()
}

impl Instance {
    pub fn from_cri(s: &cri::ContainerStatus) -> Instance {
        let state = match cri::ContainerState::try_from(s.state) {
            Ok(cri::ContainerState::ContainerCreated) => InstanceState::Created,
            Ok(cri::ContainerState::ContainerRunning) => InstanceState::Running,
            Ok(cri::ContainerState::ContainerExited) => InstanceState::Exited,
            _ => InstanceState::Unknown,
        };
        Instance {
            id: s.id.clone(),
            name: s.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default(),
            sandbox_id: String::new(),
            restart_count: labels::restart_count(&s.annotations),
            state,
            created_at: timestamp_from_nanos(s.created_at),
            started_at: timestamp_from_nanos(s.started_at),
            finished_at: timestamp_from_nanos(s.finished_at),
            exit_code: s.exit_code,
            reason: s.reason.clone(),
            message: s.message.clone(),
            image: s
                .image
                .as_ref()
                .map(
                    |i| {
                        if i.user_specified_image.is_empty() { i.image.clone() } else { i.user_specified_image.clone() }
                    },
                )
                .unwrap_or_default(),
            image_ref: s.image_ref.clone(),
            annotations: s.annotations.clone(),
        }
    }

    /// The terminated state of an exited instance.
    pub fn terminated(&self, runtime_name: &str) -> core::ContainerStateTerminated {
        let reason = if !self.reason.is_empty() {
            self.reason.clone()
        } else if self.exit_code == 0 {
            "Completed".into()
        } else {
            "Error".into()
        };
        core::ContainerStateTerminated {
            exit_code: self.exit_code,
            reason: Some(reason),
            message: Some(self.message.clone()).filter(|m| !m.is_empty()),
            started_at: self.started_at.map(Time),
            finished_at: self.finished_at.map(Time),
            container_id: Some(container_id(runtime_name, &self.id)),
            signal: None,
        }
    }
}

/// `<runtime_name>://<id>`, e.g. `berth://4f…`.
pub fn container_id(runtime_name: &str, id: &str) -> String {
    format!("{runtime_name}://{id}")
}

/// Why a container is waiting, when the worker knows better than "not created yet".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub reason: String,
    pub message: String,
}

impl Waiting {
    pub fn new(reason: &str, message: impl Into<String>) -> Self {
        Waiting { reason: reason.to_string(), message: message.into() }
    }
}

/// What is known about one container of the spec.
#[derive(Clone, Debug, Default)]
pub struct ContainerView {
    /// The newest instance, and the one before it (for `lastState`).
    pub current: Option<Instance>,
    pub previous: Option<Instance>,
    pub waiting: Option<Waiting>,
    /// Readiness: the readiness probe passes (or there is none).
    pub ready: bool,
    /// The startup probe passed (or there is none).
    pub started: bool,
}

/// What the worker observed of the pod on the node.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// The sandbox exists and is ready.
    pub sandbox_ready: bool,
    pub pod_ips: Vec<String>,
    pub host_ips: Vec<String>,
    /// By container name (init containers and containers together: names are unique in a pod).
    pub containers: HashMap<String, ContainerView>,
    /// The CRI runtime's name for container IDs.
    pub runtime_name: String,
    /// `PodReadyToStartContainers` is false for this reason and message (no runtime for the handler).
    pub sandbox_blocked: Option<Waiting>,
    /// The pod is being or has been torn down by the node: nothing will restart.
    pub terminal: bool,
    /// The pod ran past `spec.activeDeadlineSeconds`: it fails.
    pub deadline_exceeded: bool,
}

/// The reason and message of a pod that ran past its `activeDeadlineSeconds`, as kubelet's.
pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
pub const DEADLINE_EXCEEDED_MESSAGE: &str = "Pod was active on the node longer than the specified deadline";

/// When the pod's `activeDeadlineSeconds` runs out, counted from its start time.
pub fn active_deadline(spec: &core::PodSpec, start_time: Option<Timestamp>) -> Option<Timestamp> {
    let seconds = spec.active_deadline_seconds.filter(|s| *s > 0)?;
    start_time?.checked_add(jiff::SignedDuration::from_secs(seconds)).ok()
}

/// One container's status.
pub fn container_status(
    c: &core::Container,
    view: Option<&ContainerView>,
    o: &Observed,
    pending_reason: &str,
) -> core::ContainerStatus {
    let empty = ContainerView::default();
    let view = view.unwrap_or(&empty);
    let mut status = core::ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        image_id: String::new(),
        ready: false,
        restart_count: 0,
        started: Some(false),
        state: Some(core::ContainerState {
            waiting: Some(core::ContainerStateWaiting { reason: Some(pending_reason.into()), message: None }),
            ..Default::default()
        }),
        ..Default::default()
    };
    if let Some(cur) = &view.current {
        status.restart_count = cur.restart_count;
        if !cur.image.is_empty() {
            status.image = cur.image.clone();
        }
        status.image_id = cur.image_ref.clone();
        status.container_id = Some(container_id(&o.runtime_name, &cur.id));
        match cur.state {
            InstanceState::Running => {
                status.started = Some(view.started);
                status.ready = view.ready && view.started && !o.terminal;
                status.state = Some(core::ContainerState {
                    running: Some(core::ContainerStateRunning { started_at: cur.started_at.map(Time) }),
                    ..Default::default()
                });
            }
            InstanceState::Exited => {
                status.state = Some(core::ContainerState {
                    terminated: Some(cur.terminated(&o.runtime_name)),
                    ..Default::default()
                });
            }
            InstanceState::Created | InstanceState::Unknown => {}
        }
        if let Some(prev) = view.previous.as_ref().filter(|p| p.state == InstanceState::Exited) {
            status.last_state =
                Some(core::ContainerState { terminated: Some(prev.terminated(&o.runtime_name)), ..Default::default() });
        }
    }
    if let Some(w) = &view.waiting {
        // A known reason to wait (back-off, pull error, bad config): the last run moves to lastState.
        let current = status.state.take().unwrap_or_default();
        if current.terminated.is_some() {
            status.last_state = Some(current);
        } else if current.running.is_some() {
            status.state = Some(current);
            return status;
        }
        status.state = Some(core::ContainerState {
            waiting: Some(core::ContainerStateWaiting {
                reason: Some(w.reason.clone()),
                message: Some(w.message.clone()).filter(|m| !m.is_empty()),
            }),
            ..Default::default()
        });
    }
    status
}

fn state_of(
    s: &core::ContainerStatus,
) -> (&Option<core::ContainerStateRunning>, Option<&core::ContainerStateTerminated>) {
    let state = s.state.as_ref();
    static NONE: Option<core::ContainerStateRunning> = None;
    (state.map_or(&NONE, |s| &s.running), state.and_then(|s| s.terminated.as_ref()))
}

fn last_terminated(s: &core::ContainerStatus) -> Option<&core::ContainerStateTerminated> {
    s.last_state.as_ref().and_then(|l| l.terminated.as_ref())
}

/// kubelet's `getPhase`: the phase from the container statuses and the restart policy.
pub fn phase(
    spec: &core::PodSpec,
    init: &[core::ContainerStatus],
    containers: &[core::ContainerStatus],
    terminal: bool,
) -> &'static str {
    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    let (mut pending_init, mut failed_init) = (0, 0);
    // Sidecars keep running: they do not hold the phase (kubelet handles them apart too).
    for c in spec.init_containers.iter().flatten().filter(|c| !is_sidecar(c)) {
        let Some(s) = init.iter().find(|s| s.name == c.name) else {
            pending_init += 1;
            continue;
        };
        match state_of(s) {
            (Some(_), _) => pending_init += 1,
            (None, Some(t)) => {
                if t.exit_code != 0 {
                    failed_init += 1;
                }
            }
            (None, None) => match last_terminated(s) {
                Some(t) if t.exit_code != 0 => failed_init += 1,
                Some(_) => {}
                None => pending_init += 1,
            },
        }
    }
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for c in &spec.containers {
        let Some(s) = containers.iter().find(|s| s.name == c.name) else {
            unknown += 1;
            continue;
        };
        match state_of(s) {
            (Some(_), _) => running += 1,
            (None, Some(t)) => {
                stopped += 1;
                if t.exit_code == 0 {
                    succeeded += 1;
                }
            }
            (None, None) => {
                if last_terminated(s).is_some() {
                    stopped += 1;
                } else {
                    waiting += 1;
                }
            }
        }
    }
    if failed_init > 0 && policy == "Never" {
        return "Failed";
    }
    if pending_init > 0 || failed_init > 0 {
        return "Pending";
    }
    if waiting > 0 {
        return "Pending";
    }
    if running > 0 && unknown == 0 {
        return "Running";
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        if terminal {
            return if stopped == succeeded { "Succeeded" } else { "Failed" };
        }
        if policy == "Always" {
            return "Running";
        }
        if stopped == succeeded {
            return "Succeeded";
        }
        if policy == "Never" {
            return "Failed";
        }
        return "Running";
    }
    "Pending"
}

fn condition(
    old: Option<&core::PodStatus>,
    now: Timestamp,
    type_: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
) -> core::PodCondition {
    let status = if ok { "True" } else { "False" };
    // The transition time moves only when the status does.
    let previous = old.and_then(|s| s.conditions.as_ref()).and_then(|cs| cs.iter().find(|c| c.type_ == type_));
    let last_transition_time = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone().or(Some(Time(now))),
        _ => Some(Time(now)),
    };
    core::PodCondition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.map(String::from),
        message,
        last_transition_time,
        last_probe_time: None,
        observed_generation: None,
    }
}

fn names(list: &[&str]) -> String {
    format!("[{}]", list.join(" "))
}

/// The whole status of the pod. `old` is the status in the API (its start time and transition
/// times are kept); `now` stamps what changes.
pub fn pod_status(pod: &core::Pod, o: &Observed, old: Option<&core::PodStatus>, now: Timestamp) -> core::PodStatus {
    let spec = pod.spec.clone().unwrap_or_default();
    let init_specs: &[core::Container] = spec.init_containers.as_deref().unwrap_or(&[]);
    let init: Vec<core::ContainerStatus> = init_specs
        .iter()
        .map(|c| {
            let mut status = container_status(c, o.containers.get(&c.name), o, "PodInitializing");
            // kubelet: an init container (not a sidecar) is ready once it has exited 0.
            if !is_sidecar(c) {
                let exit = status.state.as_ref().and_then(|s| s.terminated.as_ref()).map(|t| t.exit_code);
                status.ready = exit == Some(0);
            }
            status
        })
        .collect();
    // An init container is done when it exited 0; a sidecar, once it started.
    let done = |c: &core::Container| {
        let s = init.iter().find(|s| s.name == c.name);
        if is_sidecar(c) {
            s.is_some_and(|s| s.started == Some(true))
        } else {
            s.and_then(|s| state_of(s).1).is_some_and(|t| t.exit_code == 0)
        }
    };
    let initialized = init_specs.iter().all(done);
    let pending = if initialized { "ContainerCreating" } else { "PodInitializing" };
    let mut containers: Vec<core::ContainerStatus> =
        spec.containers.iter().map(|c| container_status(c, o.containers.get(&c.name), o, pending)).collect();
    containers.sort_by(|a, b| a.name.cmp(&b.name));
    let mut phase = phase(&spec, &init, &containers, o.terminal);
    let old_phase = old.and_then(|s| s.phase.as_deref());
    let mut reason = old.and_then(|s| s.reason.clone());
    let mut message = old.and_then(|s| s.message.clone());
    if matches!(old_phase, Some("Succeeded" | "Failed")) {
        // A terminal phase is final.
        phase = if old_phase == Some("Succeeded") { "Succeeded" } else { "Failed" };
    } else if o.deadline_exceeded {
        phase = "Failed";
        reason = Some(DEADLINE_EXCEEDED.into());
        message = Some(DEADLINE_EXCEEDED_MESSAGE.into());
    }
    let completed = phase == "Succeeded";

    let mut conditions = Vec::new();
    let sandbox_ok = o.sandbox_ready && (!o.pod_ips.is_empty() || spec.host_network == Some(true));
    let blocked = o.sandbox_blocked.as_ref();
    conditions.push(condition(
        old,
        now,
        "PodReadyToStartContainers",
        sandbox_ok,
        blocked.map(|w| w.reason.as_str()),
        blocked.map(|w| w.message.clone()),
    ));
    let incomplete: Vec<&str> = init_specs.iter().filter(|c| !done(c)).map(|c| c.name.as_str()).collect();
    conditions.push(if completed {
        condition(old, now, "Initialized", true, Some("PodCompleted"), None)
    } else if incomplete.is_empty() {
        condition(old, now, "Initialized", true, None, None)
    } else {
        condition(
            old,
            now,
            "Initialized",
            false,
            Some("ContainersNotInitialized"),
            Some(format!("containers with incomplete status: {}", names(&incomplete))),
        )
    });
    // Sidecars count for readiness like containers.
    let unready: Vec<&str> = init_specs
        .iter()
        .filter(|c| is_sidecar(c))
        .filter(|c| !init.iter().any(|s| s.name == c.name && s.ready))
        .chain(spec.containers.iter().filter(|c| !containers.iter().any(|s| s.name == c.name && s.ready)))
        .map(|c| c.name.as_str())
        .collect();
    for type_ in ["ContainersReady", "Ready"] {
        conditions.push(if completed {
            condition(old, now, type_, false, Some("PodCompleted"), None)
        } else if unready.is_empty() {
            condition(old, now, type_, true, None, None)
        } else {
            condition(
                old,
                now,
                type_,
                false,
                Some("ContainersNotReady"),
                Some(format!("containers with unready status: {}", names(&unready))),
            )
        });
    }
    let scheduled = old
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled").cloned())
        .unwrap_or_else(|| condition(None, now, "PodScheduled", true, None, None));
    conditions.push(scheduled);

    let ip_list = |ips: &[String]| -> Option<Vec<core::PodIP>> {
        (!ips.is_empty()).then(|| ips.iter().map(|ip| core::PodIP { ip: ip.clone() }).collect())
    };
    let host_ip_list = |ips: &[String]| -> Option<Vec<core::HostIP>> {
        (!ips.is_empty()).then(|| ips.iter().map(|ip| core::HostIP { ip: ip.clone() }).collect())
    };
    core::PodStatus {
        phase: Some(phase.to_string()),
        conditions: Some(conditions),
        host_ip: o.host_ips.first().cloned(),
        host_ips: host_ip_list(&o.host_ips),
        pod_ip: o.pod_ips.first().cloned(),
        pod_ips: ip_list(&o.pod_ips),
        start_time: old.and_then(|s| s.start_time.clone()).or(Some(Time(now))),
        qos_class: old
            .and_then(|s| s.qos_class.clone())
            .or_else(|| Some(berth_api::kinds::pod_qos_class(&spec).to_string())),
        container_statuses: Some(containers),
        init_container_statuses: (!init.is_empty()).then_some(init),
        reason,
        message,
        ..Default::default()
    }
}

/// Newest first within each container name.
pub fn sort_instances(instances: &mut [Instance]) {
    instances.sort_by(|a, b| {
        a.name.cmp(&b.name).then(b.restart_count.cmp(&a.restart_count)).then(b.created_at.cmp(&a.created_at))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn container(name: &str) -> core::Container {
        core::Container { name: name.into(), image: Some(format!("img/{name}")), ..Default::default() }
    }

    fn pod(containers: &[&str], init: &[&str], policy: &str) -> core::Pod {
        core::Pod {
            metadata: ObjectMeta { name: Some("web".into()), uid: Some("u".into()), ..Default::default() },
            spec: Some(core::PodSpec {
                containers: containers.iter().map(|n| container(n)).collect(),
                init_containers: (!init.is_empty()).then(|| init.iter().map(|n| container(n)).collect()),
                restart_policy: Some(policy.into()),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn instance(name: &str, state: InstanceState, exit_code: i32, restarts: i32) -> Instance {
        Instance {
            id: format!("{name}-{restarts}"),
            name: name.into(),
            sandbox_id: "s".into(),
            restart_count: restarts,
            state,
            created_at: Some(at(restarts.into())),
            started_at: Some(at(restarts.into())),
            finished_at: (state == InstanceState::Exited).then(|| at(i64::from(restarts) + 1)),
            exit_code,
            reason: String::new(),
            message: String::new(),
            image: String::new(),
            image_ref: "sha256:img".into(),
            annotations: HashMap::new(),
        }
    }

    fn observed(views: Vec<(&str, ContainerView)>) -> Observed {
        Observed {
            sandbox_ready: true,
            pod_ips: vec!["10.88.0.7".into()],
            host_ips: vec!["192.0.2.1".into()],
            containers: views.into_iter().map(|(n, v)| (n.to_string(), v)).collect(),
            runtime_name: "berth".into(),
            ..Default::default()
        }
    }

    fn running(name: &str) -> ContainerView {
        ContainerView {
            current: Some(instance(name, InstanceState::Running, 0, 0)),
            ready: true,
            started: true,
            ..Default::default()
        }
    }

    fn cond<'a>(s: &'a core::PodStatus, t: &str) -> &'a core::PodCondition {
        s.conditions.as_ref().unwrap().iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn a_running_pod_is_ready_with_ips_ids_and_all_conditions_true() {
        let p = pod(&["b", "a"], &[], "Always");
        let s = pod_status(&p, &observed(vec![("a", running("a")), ("b", running("b"))]), None, at(50));
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.88.0.7"));
        assert_eq!(s.host_ip.as_deref(), Some("192.0.2.1"));
        assert_eq!(s.start_time, Some(Time(at(50))));
        assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
        for t in ["PodScheduled", "PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready"] {
            assert_eq!(cond(&s, t).status, "True", "{t}");
        }
        let cs = s.container_statuses.unwrap();
        assert_eq!(cs.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), vec!["a", "b"], "sorted by name");
        assert_eq!(cs[0].container_id.as_deref(), Some("berth://a-0"));
        assert_eq!(cs[0].image, "img/a");
        assert_eq!(cs[0].image_id, "sha256:img");
        assert!(cs[0].ready && cs[0].started == Some(true));
        assert_eq!(cs[0].state.as_ref().unwrap().running.as_ref().unwrap().started_at, Some(Time(at(0))));
    }

    #[test]
    fn a_pod_without_containers_yet_is_pending_creating_and_not_ready() {
        let p = pod(&["app"], &[], "Always");
        let mut o = observed(vec![]);
        o.sandbox_ready = false;
        o.pod_ips.clear();
        let s = pod_status(&p, &o, None, at(0));
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        let w = s.container_statuses.as_ref().unwrap()[0].state.clone().unwrap().waiting.unwrap();
        assert_eq!(w.reason.as_deref(), Some("ContainerCreating"));
        assert_eq!(cond(&s, "PodReadyToStartContainers").status, "False");
        let ready = cond(&s, "Ready");
        assert_eq!((ready.status.as_str(), ready.reason.as_deref()), ("False", Some("ContainersNotReady")));
        assert_eq!(ready.message.as_deref(), Some("containers with unready status: [app]"));
    }

    #[test]
    fn a_crash_looping_container_waits_with_its_last_run_in_last_state() {
        let p = pod(&["app"], &[], "Always");
        let mut view = ContainerView {
            current: Some(instance("app", InstanceState::Exited, 2, 3)),
            previous: Some(instance("app", InstanceState::Exited, 2, 2)),
            ..Default::default()
        };
        view.waiting =
            Some(Waiting::new("CrashLoopBackOff", "back-off 40s restarting failed container=app pod=web_default(u)"));
        let s = pod_status(&p, &observed(vec![("app", view)]), None, at(9));
        assert_eq!(s.phase.as_deref(), Some("Running"), "restartPolicy Always keeps a crashing pod Running");
        let c = &s.container_statuses.as_ref().unwrap()[0];
        assert_eq!(c.restart_count, 3);
        let w = c.state.as_ref().unwrap().waiting.as_ref().unwrap();
        assert_eq!(w.reason.as_deref(), Some("CrashLoopBackOff"));
        let last = c.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!((last.exit_code, last.reason.as_deref()), (2, Some("Error")));
        assert_eq!(last.container_id.as_deref(), Some("berth://app-3"));
        assert!(!c.ready);
    }

    #[test]
    fn a_restarted_running_container_shows_the_previous_run_as_last_state() {
        let p = pod(&["app"], &[], "Always");
        let view = ContainerView {
            current: Some(instance("app", InstanceState::Running, 0, 1)),
            previous: Some(instance("app", InstanceState::Exited, 137, 0)),
            ready: false,
            started: true,
            ..Default::default()
        };
        let s = pod_status(&p, &observed(vec![("app", view)]), None, at(9));
        let c = &s.container_statuses.as_ref().unwrap()[0];
        assert!(c.state.as_ref().unwrap().running.is_some());
        assert_eq!(c.last_state.as_ref().unwrap().terminated.as_ref().unwrap().exit_code, 137);
        assert!(!c.ready, "readiness failing");
        assert_eq!(cond(&s, "ContainersReady").status, "False");
    }

    #[test]
    fn phases_follow_the_restart_policy_once_everything_stopped() {
        let exited = |code| ContainerView {
            current: Some(instance("app", InstanceState::Exited, code, 0)),
            ..Default::default()
        };
        let phase_of = |policy: &str, code: i32| {
            let p = pod(&["app"], &[], policy);
            pod_status(&p, &observed(vec![("app", exited(code))]), None, at(0)).phase.unwrap()
        };
        assert_eq!(phase_of("Never", 0), "Succeeded");
        assert_eq!(phase_of("Never", 1), "Failed");
        assert_eq!(phase_of("OnFailure", 0), "Succeeded");
        assert_eq!(phase_of("OnFailure", 1), "Running");
        assert_eq!(phase_of("Always", 0), "Running");
        let p = pod(&["app"], &[], "Always");
        let mut o = observed(vec![("app", exited(0))]);
        o.terminal = true;
        assert_eq!(pod_status(&p, &o, None, at(0)).phase.unwrap(), "Succeeded", "a deleted pod ends terminal");
    }

    #[test]
    fn a_succeeded_pod_reports_completed_conditions_and_stays_succeeded() {
        let p = pod(&["app"], &[], "Never");
        let o = observed(vec![(
            "app",
            ContainerView { current: Some(instance("app", InstanceState::Exited, 0, 0)), ..Default::default() },
        )]);
        let s = pod_status(&p, &o, None, at(0));
        assert_eq!(cond(&s, "Ready").reason.as_deref(), Some("PodCompleted"));
        assert_eq!(cond(&s, "Initialized").reason.as_deref(), Some("PodCompleted"));
        let again = pod_status(&p, &observed(vec![]), Some(&s), at(5));
        assert_eq!(again.phase.as_deref(), Some("Succeeded"), "terminal phases are final");
    }

    #[test]
    fn init_containers_hold_the_pod_pending_and_fail_it_under_never() {
        let p = pod(&["app"], &["setup"], "Never");
        let s = pod_status(&p, &observed(vec![("setup", running("setup"))]), None, at(0));
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        let init = cond(&s, "Initialized");
        assert_eq!(init.message.as_deref(), Some("containers with incomplete status: [setup]"));
        let w = s.container_statuses.as_ref().unwrap()[0].state.clone().unwrap().waiting.unwrap();
        assert_eq!(w.reason.as_deref(), Some("PodInitializing"));
        let failed =
            ContainerView { current: Some(instance("setup", InstanceState::Exited, 3, 0)), ..Default::default() };
        let s = pod_status(&p, &observed(vec![("setup", failed.clone())]), None, at(0));
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        let p = pod(&["app"], &["setup"], "Always");
        assert_eq!(pod_status(&p, &observed(vec![("setup", failed)]), None, at(0)).phase.as_deref(), Some("Pending"));
        let done =
            ContainerView { current: Some(instance("setup", InstanceState::Exited, 0, 0)), ..Default::default() };
        let s = pod_status(&p, &observed(vec![("setup", done), ("app", running("app"))]), None, at(0));
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&s, "Initialized").status, "True");
        assert!(s.init_container_statuses.as_ref().unwrap()[0].ready, "an init container that exited 0 is ready");
    }

    #[test]
    fn a_pod_past_its_active_deadline_fails_with_kubelets_reason_for_good() {
        let mut p = pod(&["app"], &[], "Always");
        p.spec.as_mut().unwrap().active_deadline_seconds = Some(5);
        assert_eq!(active_deadline(p.spec.as_ref().unwrap(), Some(at(10))), Some(at(15)));
        assert_eq!(active_deadline(p.spec.as_ref().unwrap(), None), None);
        let mut o = observed(vec![("app", running("app"))]);
        o.deadline_exceeded = true;
        let s = pod_status(&p, &o, None, at(20));
        assert_eq!(
            (s.phase.as_deref(), s.reason.as_deref(), s.message.as_deref()),
            (
                Some("Failed"),
                Some("DeadlineExceeded"),
                Some("Pod was active on the node longer than the specified deadline")
            )
        );
        o.deadline_exceeded = false;
        let later = pod_status(&p, &o, Some(&s), at(30));
        assert_eq!((later.phase.as_deref(), later.reason.as_deref()), (Some("Failed"), Some("DeadlineExceeded")));
    }

    #[test]
    fn transition_times_move_only_when_a_condition_changes() {
        let p = pod(&["app"], &[], "Always");
        let first = pod_status(&p, &observed(vec![("app", running("app"))]), None, at(0));
        let same = pod_status(&p, &observed(vec![("app", running("app"))]), Some(&first), at(30));
        assert_eq!(first, same, "nothing changed, nothing to patch");
        let mut unready = running("app");
        unready.ready = false;
        let changed = pod_status(&p, &observed(vec![("app", unready)]), Some(&first), at(60));
        assert_eq!(cond(&changed, "Ready").last_transition_time, Some(Time(at(60))));
        assert_eq!(cond(&changed, "Initialized").last_transition_time, Some(Time(at(0))));
        assert_eq!(changed.start_time, Some(Time(at(0))));
    }

    #[test]
    fn the_image_shown_is_the_running_containers_not_the_new_spec() {
        let p = pod(&["app"], &[], "Always");
        let mut view = running("app");
        view.current.as_mut().unwrap().image = "img/app:1".into();
        let s = pod_status(&p, &observed(vec![("app", view)]), None, at(0));
        assert_eq!(s.container_statuses.unwrap()[0].image, "img/app:1", "the spec says img/app");
    }

    #[test]
    fn a_started_sidecar_initializes_counts_for_readiness_and_does_not_hold_the_phase() {
        let mut p = pod(&["app"], &["proxy"], "Never");
        p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].restart_policy = Some("Always".into());
        let mut proxy = running("proxy");
        proxy.ready = false;
        let s = pod_status(&p, &observed(vec![("proxy", proxy.clone()), ("app", running("app"))]), None, at(0));
        assert_eq!((s.phase.as_deref(), cond(&s, "Initialized").status.as_str()), (Some("Running"), "True"));
        assert_eq!(cond(&s, "Ready").message.as_deref(), Some("containers with unready status: [proxy]"));
        proxy.started = false;
        let s = pod_status(&p, &observed(vec![("proxy", proxy.clone())]), None, at(0));
        assert_eq!(cond(&s, "Initialized").message.as_deref(), Some("containers with incomplete status: [proxy]"));
        let finished =
            ContainerView { current: Some(instance("app", InstanceState::Exited, 0, 0)), ..Default::default() };
        let s = pod_status(&p, &observed(vec![("proxy", running("proxy")), ("app", finished)]), None, at(0));
        assert_eq!(s.phase.as_deref(), Some("Succeeded"), "the sidecar still runs; the pod is done");
    }

    #[test]
    fn a_blocked_sandbox_reports_its_reason_on_pod_ready_to_start_containers() {
        let p = pod(&["app"], &[], "Always");
        let mut o = observed(vec![]);
        o.sandbox_ready = false;
        o.sandbox_blocked = Some(Waiting::new("RuntimeHandlerNotFound", "runtime handler \"kata\" is not served"));
        let s = pod_status(&p, &o, None, at(0));
        let c = cond(&s, "PodReadyToStartContainers");
        assert_eq!((c.status.as_str(), c.reason.as_deref()), ("False", Some("RuntimeHandlerNotFound")));
        assert_eq!(c.message.as_deref(), Some("runtime handler \"kata\" is not served"));
    }
}
