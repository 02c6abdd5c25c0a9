//! A container's record: what CreateContainer asked for, what the runtime made of it, and the CRI
//! state machine `() → Created → Running → Exited → ()` with the guards of each verb.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use serde::{Deserialize, Serialize};

use super::disk::decode_config;
use super::error::{Action, Kind, StateError};
use super::sandbox::SandboxRecord;

/// The CRI `ContainerMetadata`: unique per (sandbox, name, attempt).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerMetadata {
    pub name: String,
    pub attempt: u32,
}

/// The CRI container state machine (seed `001`), with CRI's UNKNOWN for a container whose process
/// the runtime lost track of.
///
/// ```text
/// () ──create──▶ Created ──start──▶ Running ──mark_exited──▶ Exited ──remove──▶ ()
///                   │                  │                        ▲
///                   │                  └──mark_unknown──▶ Unknown┤
///                   └──────────mark_exited (killed before start)─┘
/// ```
/// StopContainer of a `Created` or `Exited` container is a successful no-op (CRI makes stop
/// idempotent); of a `Running` or `Unknown` one it kills the process and then marks it exited.
/// Remove needs `Created` or `Exited`: the RPC layer stops a running container first.
/// `Unknown` may also be marked exited, or it could never be removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    /// Also the default of a record missing its state.
    #[default]
    Unknown,
}

impl ContainerState {
    /// `start` applies only to a created container.
    pub fn can_start(self) -> bool {
        self == ContainerState::Created
    }

    /// Whether stop has a process to kill; for `Created` and `Exited` stop succeeds doing nothing.
    pub fn can_stop(self) -> bool {
        matches!(self, ContainerState::Running | ContainerState::Unknown)
    }

    /// Remove applies to a container that is not (or no longer) running.
    pub fn can_remove(self) -> bool {
        matches!(self, ContainerState::Created | ContainerState::Exited)
    }

    /// An exit can be recorded once, for a container that has not exited yet.
    pub fn can_mark_exited(self) -> bool {
        matches!(self, ContainerState::Created | ContainerState::Running | ContainerState::Unknown)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ContainerState::Created => "created",
            ContainerState::Running => "running",
            ContainerState::Exited => "exited",
            ContainerState::Unknown => "unknown",
        }
    }

    pub fn to_cri(self) -> cri::ContainerState {
        match self {
            ContainerState::Created => cri::ContainerState::ContainerCreated,
            ContainerState::Running => cri::ContainerState::ContainerRunning,
            ContainerState::Exited => cri::ContainerState::ContainerExited,
            ContainerState::Unknown => cri::ContainerState::ContainerUnknown,
        }
    }
}

/// The CRI `reason` of an exited container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReason {
    /// Exit code 0.
    Completed,
    /// A non-zero exit code.
    Error,
    /// The kernel's OOM killer killed a process of the container (CRI requires this spelling).
    OomKilled,
    /// The exit could not be observed (the process vanished while the runtime was down).
    Unknown,
    /// The OCI runtime could not start the process (containerd's `StartError`, exit code 128).
    StartError,
}

impl ExitReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ExitReason::Completed => "Completed",
            ExitReason::Error => "Error",
            ExitReason::OomKilled => "OOMKilled",
            ExitReason::Unknown => "Unknown",
            ExitReason::StartError => "StartError",
        }
    }

    /// containerd's rule: OOM wins, then 0 is `Completed` and anything else `Error`.
    pub fn from_exit(code: i32, oom_killed: bool) -> Self {
        match (oom_killed, code) {
            (true, _) => ExitReason::OomKilled,
            (false, 0) => ExitReason::Completed,
            (false, _) => ExitReason::Error,
        }
    }
}

impl fmt::Display for ExitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// containerd's exit code for a container whose start failed.
pub const START_ERROR_EXIT_CODE: i32 = 128;

/// How a container ended, as `mark_exited` records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    pub code: i32,
    /// Nanoseconds since the epoch.
    pub finished_at: i64,
    pub reason: ExitReason,
    pub message: String,
}

impl Exit {
    /// An observed exit, its reason derived from the code and the OOM flag.
    pub fn observed(code: i32, finished_at: i64, oom_killed: bool) -> Self {
        Exit { code, finished_at, reason: ExitReason::from_exit(code, oom_killed), message: String::new() }
    }

    /// A start that failed, as containerd records it: code 128, reason `StartError`, the error
    /// as message.
    pub fn start_error(finished_at: i64, message: impl Into<String>) -> Self {
        Exit { code: START_ERROR_EXIT_CODE, finished_at, reason: ExitReason::StartError, message: message.into() }
    }

    /// An exit that was not observed: code 255, reason `Unknown`, at `finished_at`.
    pub fn unknown(finished_at: i64, message: impl Into<String>) -> Self {
        Exit { code: super::UNKNOWN_EXIT_CODE, finished_at, reason: ExitReason::Unknown, message: message.into() }
    }
}

/// One mount as ContainerStatus reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct MountRecord {
    pub container_path: String,
    pub host_path: String,
    pub readonly: bool,
    pub recursive_read_only: bool,
    pub selinux_relabel: bool,
    /// CRI `MountPropagation`: 0 private, 1 host-to-container, 2 bidirectional.
    pub propagation: i32,
}

impl MountRecord {
    fn to_cri(&self) -> cri::Mount {
        cri::Mount {
            container_path: self.container_path.clone(),
            host_path: self.host_path.clone(),
            readonly: self.readonly,
            recursive_read_only: self.recursive_read_only,
            selinux_relabel: self.selinux_relabel,
            propagation: self.propagation,
            ..Default::default()
        }
    }
}

impl From<&cri::Mount> for MountRecord {
    fn from(m: &cri::Mount) -> Self {
        MountRecord {
            container_path: m.container_path.clone(),
            host_path: m.host_path.clone(),
            readonly: m.readonly,
            recursive_read_only: m.recursive_read_only,
            selinux_relabel: m.selinux_relabel,
            propagation: m.propagation,
        }
    }
}

/// Everything the runtime keeps about one container, stored as `containers/<id>/container.json`.
///
/// Fields the RPC layer fills in (pids, bundle, image identity, mounts) are public; the state and
/// the exit fields change only through the guarded transitions. New fields must be
/// `#[serde(default)]`-compatible (the whole struct is), so older files keep loading.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerRecord {
    pub id: String,
    pub sandbox_id: String,
    pub metadata: ContainerMetadata,
    /// The image as CreateContainer named it (`ImageSpec.image`).
    pub image: String,
    /// The image as the user wrote it, when kubelet passes it (`user_specified_image`).
    pub user_image: String,
    /// The digested reference of the image in use (`image_ref` in CRI).
    pub image_ref: String,
    /// The image's id on this node, as the image service reports it (`image_id` in CRI).
    pub image_id: String,
    /// The runtime handler: the sandbox's, which is also the handler the image was resolved for.
    pub handler: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The CRI log file: the sandbox's log directory joined with the config's `log_path`, or
    /// empty when either is empty (no log).
    pub log_path: String,
    state: ContainerState,
    /// Nanoseconds since the epoch; 0 when not yet.
    pub created_at: i64,
    started_at: i64,
    finished_at: i64,
    exit_code: i32,
    reason: String,
    message: String,
    /// The container's init process on the host.
    pub pid: Option<i32>,
    /// The container's monitor process.
    pub monitor_pid: Option<i32>,
    /// The OCI bundle (holds `config.json` and the rootfs mount point).
    pub bundle: PathBuf,
    pub mounts: Vec<MountRecord>,
    /// The `ContainerConfig` as CreateContainer received it (k8s-cri's serde form); see
    /// [`ContainerRecord::container_config`].
    pub config: serde_json::Value,
}

impl ContainerRecord {
    /// A new record in state `Created` with a fresh id, from CreateContainer's config, in
    /// `sandbox`. The config must carry metadata with a name.
    pub fn new(config: &cri::ContainerConfig, sandbox: &SandboxRecord, created_at: i64) -> Result<Self, StateError> {
        let invalid = |reason| StateError::Invalid { kind: Kind::Container, reason };
        let m = config.metadata.as_ref().ok_or(invalid("the config has no metadata"))?;
        if m.name.is_empty() {
            return Err(invalid("the metadata has no name"));
        }
        let log_path = if sandbox.log_directory.is_empty() || config.log_path.is_empty() {
            String::new()
        } else {
            Path::new(&sandbox.log_directory).join(&config.log_path).to_string_lossy().into_owned()
        };
        let image = config.image.as_ref();
        Ok(ContainerRecord {
            id: super::new_id(),
            sandbox_id: sandbox.id.clone(),
            metadata: ContainerMetadata { name: m.name.clone(), attempt: m.attempt },
            image: image.map(|i| i.image.clone()).unwrap_or_default(),
            user_image: image.map(|i| i.user_specified_image.clone()).unwrap_or_default(),
            handler: sandbox.runtime_handler.clone(),
            labels: config.labels.clone().into_iter().collect(),
            annotations: config.annotations.clone().into_iter().collect(),
            log_path,
            state: ContainerState::Created,
            created_at,
            mounts: config.mounts.iter().map(MountRecord::from).collect(),
            config: serde_json::to_value(config).expect("a CRI config serializes"),
            ..Default::default()
        })
    }

    pub fn state(&self) -> ContainerState {
        self.state
    }

    pub fn started_at(&self) -> i64 {
        self.started_at
    }

    pub fn finished_at(&self) -> i64 {
        self.finished_at
    }

    pub fn exit_code(&self) -> i32 {
        self.exit_code
    }

    pub fn reason(&self) -> &str {
        &self.reason
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// The key that must be unique among containers: (sandbox id, name, attempt).
    pub fn reservation_key(&self) -> String {
        serde_json::to_string(&(&self.sandbox_id, &self.metadata.name, self.metadata.attempt))
            .expect("strings serialize")
    }

    /// The reserved name for messages: `name_sandboxid_attempt`.
    pub fn display_name(&self) -> String {
        format!("{}_{}_{}", self.metadata.name, self.sandbox_id, self.metadata.attempt)
    }

    /// `Ok` if the state allows `action`, else the `IllegalTransition` naming it.
    pub fn ensure(&self, action: Action) -> Result<(), StateError> {
        let allowed = match action {
            Action::Start => self.state.can_start(),
            // Stopping is idempotent: never an error, only sometimes a no-op (`can_stop`).
            Action::Stop => true,
            Action::Remove => self.state.can_remove(),
            Action::MarkExited => self.state.can_mark_exited(),
            Action::MarkUnknown => self.state != ContainerState::Exited,
            Action::MarkReady | Action::CreateContainerIn | Action::StartContainerIn => false,
        };
        if allowed {
            Ok(())
        } else {
            Err(StateError::IllegalTransition {
                kind: Kind::Container,
                id: self.id.clone(),
                from: self.state.as_str(),
                action,
            })
        }
    }

    /// `Created → Running`: the OCI runtime's `start` succeeded.
    pub fn start(&mut self, pid: Option<i32>, started_at: i64) -> Result<(), StateError> {
        self.ensure(Action::Start)?;
        self.state = ContainerState::Running;
        self.started_at = started_at;
        if pid.is_some() {
            self.pid = pid;
        }
        Ok(())
    }

    /// `Created | Running | Unknown → Exited`, once. A racing second observer (the exit watcher
    /// and StopContainer both see the exit) gets `IllegalTransition` and should check
    /// `state().can_mark_exited()` first.
    pub fn mark_exited(&mut self, exit: Exit) -> Result<(), StateError> {
        self.ensure(Action::MarkExited)?;
        self.state = ContainerState::Exited;
        self.finished_at = exit.finished_at;
        self.exit_code = exit.code;
        self.reason = exit.reason.as_str().to_string();
        self.message = exit.message;
        Ok(())
    }

    /// `Created | Running → Unknown`: the runtime cannot tell what became of the process
    /// (idempotent on `Unknown`).
    pub fn mark_unknown(&mut self, message: impl Into<String>) -> Result<(), StateError> {
        self.ensure(Action::MarkUnknown)?;
        self.state = ContainerState::Unknown;
        self.reason = ExitReason::Unknown.as_str().to_string();
        self.message = message.into();
        Ok(())
    }

    /// `Unknown → Running`: a process the runtime had lost is seen running again.
    pub(crate) fn resume(&mut self, pid: i32, now: i64) {
        debug_assert_eq!(self.state, ContainerState::Unknown);
        self.state = ContainerState::Running;
        self.pid = Some(pid);
        if self.started_at == 0 {
            self.started_at = now;
        }
        self.reason.clear();
        self.message.clear();
    }

    /// The stored `ContainerConfig`, decoded with top-level fields that a newer k8s-cri added
    /// filled with their defaults.
    pub fn container_config(&self) -> Result<cri::ContainerConfig, StateError> {
        decode_config(&self.config).map_err(|source| StateError::Decode {
            kind: Kind::Container,
            id: self.id.clone(),
            source,
        })
    }

    fn image_spec(&self) -> cri::ImageSpec {
        cri::ImageSpec {
            image: self.image.clone(),
            user_specified_image: self.user_image.clone(),
            runtime_handler: self.handler.clone(),
            ..Default::default()
        }
    }

    /// The ListContainers item.
    pub fn to_cri(&self) -> cri::Container {
        cri::Container {
            id: self.id.clone(),
            pod_sandbox_id: self.sandbox_id.clone(),
            metadata: Some(cri::ContainerMetadata { name: self.metadata.name.clone(), attempt: self.metadata.attempt }),
            image: Some(self.image_spec()),
            image_ref: self.image_ref.clone(),
            image_id: self.image_id.clone(),
            state: self.state.to_cri() as i32,
            created_at: self.created_at,
            labels: self.labels.clone().into_iter().collect(),
            annotations: self.annotations.clone().into_iter().collect(),
        }
    }

    /// The ContainerStatus, without the resources and user the RPC layer adds from the spec.
    pub fn to_cri_status(&self) -> cri::ContainerStatus {
        cri::ContainerStatus {
            id: self.id.clone(),
            metadata: Some(cri::ContainerMetadata { name: self.metadata.name.clone(), attempt: self.metadata.attempt }),
            state: self.state.to_cri() as i32,
            created_at: self.created_at,
            started_at: self.started_at,
            finished_at: self.finished_at,
            exit_code: self.exit_code,
            image: Some(self.image_spec()),
            image_ref: self.image_ref.clone(),
            image_id: self.image_id.clone(),
            reason: self.reason.clone(),
            message: self.message.clone(),
            labels: self.labels.clone().into_iter().collect(),
            annotations: self.annotations.clone().into_iter().collect(),
            mounts: self.mounts.iter().map(MountRecord::to_cri).collect(),
            log_path: self.log_path.clone(),
            resources: None,
            user: None,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::state::sandbox::tests::sandbox;

    pub(crate) fn container_config(name: &str, attempt: u32) -> cri::ContainerConfig {
        cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata { name: name.into(), attempt }),
            image: Some(cri::ImageSpec { image: "127.0.0.1:5000/app:1.0".into(), ..Default::default() }),
            command: vec!["/bin/app".into()],
            log_path: format!("{name}/{attempt}.log"),
            labels: HashMap::from([("role".into(), name.into())]),
            mounts: vec![cri::Mount {
                container_path: "/data".into(),
                host_path: "/srv/data".into(),
                readonly: true,
                propagation: 1,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    pub(crate) fn container_in(sandbox: &SandboxRecord, name: &str) -> ContainerRecord {
        ContainerRecord::new(&container_config(name, 0), sandbox, 2_000).unwrap()
    }

    fn created() -> ContainerRecord {
        container_in(&sandbox("web"), "app")
    }

    fn running() -> ContainerRecord {
        let mut c = created();
        c.start(Some(42), 3_000).unwrap();
        c
    }

    fn exited() -> ContainerRecord {
        let mut c = running();
        c.mark_exited(Exit::observed(0, 4_000, false)).unwrap();
        c
    }

    fn unknown() -> ContainerRecord {
        let mut c = running();
        c.mark_unknown("lost").unwrap();
        c
    }

    fn illegal(r: Result<(), StateError>) -> (&'static str, Action) {
        match r {
            Err(StateError::IllegalTransition { kind: Kind::Container, from, action, .. }) => (from, action),
            other => panic!("expected an illegal transition, got {other:?}"),
        }
    }

    #[test]
    fn a_new_container_is_created_with_its_log_path_and_mounts() {
        let s = sandbox("web");
        let c = container_in(&s, "app");
        assert_eq!(c.state(), ContainerState::Created);
        assert_eq!(c.sandbox_id, s.id);
        assert_eq!(c.handler, "runc");
        assert_eq!(c.log_path, "/var/log/pods/web/app/0.log");
        assert_eq!(c.mounts[0].host_path, "/srv/data");
        assert_eq!(c.container_config().unwrap(), container_config("app", 0));
        let status = c.to_cri_status();
        assert_eq!(status.state, cri::ContainerState::ContainerCreated as i32);
        assert_eq!(status.mounts[0].propagation, 1);
        assert_eq!(status.image.unwrap().image, "127.0.0.1:5000/app:1.0");
    }

    #[test]
    fn no_log_directory_or_no_log_path_means_no_log() {
        let mut s = sandbox("web");
        s.log_directory.clear();
        assert_eq!(container_in(&s, "app").log_path, "");
        let mut cfg = container_config("app", 0);
        cfg.log_path.clear();
        assert_eq!(ContainerRecord::new(&cfg, &sandbox("web"), 1).unwrap().log_path, "");
    }

    #[test]
    fn a_config_without_metadata_is_invalid() {
        let mut cfg = container_config("app", 0);
        cfg.metadata = None;
        assert!(matches!(ContainerRecord::new(&cfg, &sandbox("web"), 1), Err(StateError::Invalid { .. })));
    }

    #[test]
    fn created_starts_into_running_with_pid_and_time() {
        let c = running();
        assert_eq!(c.state(), ContainerState::Running);
        assert_eq!((c.pid, c.started_at()), (Some(42), 3_000));
    }

    #[test]
    fn only_a_created_container_can_start() {
        assert_eq!(illegal(running().start(None, 1)), ("running", Action::Start));
        assert_eq!(illegal(exited().start(None, 1)), ("exited", Action::Start));
        assert_eq!(illegal(unknown().start(None, 1)), ("unknown", Action::Start));
    }

    #[test]
    fn running_exits_with_code_time_and_reason() {
        let mut c = running();
        c.mark_exited(Exit::observed(3, 5_000, false)).unwrap();
        assert_eq!(c.state(), ContainerState::Exited);
        assert_eq!((c.exit_code(), c.finished_at(), c.reason()), (3, 5_000, "Error"));
        assert_eq!(c.to_cri().state, cri::ContainerState::ContainerExited as i32);
    }

    #[test]
    fn a_created_container_can_be_marked_exited_without_a_start_time() {
        let mut c = created();
        c.mark_exited(Exit::observed(137, 5_000, false)).unwrap();
        assert_eq!((c.state(), c.started_at(), c.exit_code()), (ContainerState::Exited, 0, 137));
    }

    #[test]
    fn an_unknown_container_can_be_marked_exited() {
        let mut c = unknown();
        c.mark_exited(Exit::unknown(6_000, "gone")).unwrap();
        assert_eq!((c.exit_code(), c.reason(), c.message()), (255, "Unknown", "gone"));
    }

    #[test]
    fn an_exit_is_recorded_only_once() {
        let mut c = exited();
        assert_eq!(illegal(c.mark_exited(Exit::observed(1, 9, false))), ("exited", Action::MarkExited));
        assert_eq!((c.exit_code(), c.finished_at()), (0, 4_000), "the first exit stays");
    }

    #[test]
    fn exit_reasons_follow_oom_then_code() {
        assert_eq!(Exit::observed(0, 1, false).reason.as_str(), "Completed");
        assert_eq!(Exit::observed(1, 1, false).reason.as_str(), "Error");
        assert_eq!(Exit::observed(137, 1, true).reason.as_str(), "OOMKilled");
        assert_eq!(Exit::observed(0, 1, true).reason, ExitReason::OomKilled);
    }

    #[test]
    fn stop_is_never_illegal_but_only_running_or_unknown_have_something_to_stop() {
        for (c, needs_kill) in [(created(), false), (running(), true), (exited(), false), (unknown(), true)] {
            assert!(c.ensure(Action::Stop).is_ok());
            assert_eq!(c.state().can_stop(), needs_kill, "{:?}", c.state());
        }
    }

    #[test]
    fn only_created_or_exited_containers_can_be_removed() {
        assert!(created().ensure(Action::Remove).is_ok());
        assert!(exited().ensure(Action::Remove).is_ok());
        assert_eq!(illegal(running().ensure(Action::Remove)), ("running", Action::Remove));
        assert_eq!(illegal(unknown().ensure(Action::Remove)), ("unknown", Action::Remove));
    }

    #[test]
    fn sandbox_verbs_are_never_legal_on_a_container() {
        assert_eq!(illegal(created().ensure(Action::MarkReady)), ("created", Action::MarkReady));
        assert_eq!(illegal(created().ensure(Action::CreateContainerIn)), ("created", Action::CreateContainerIn));
    }

    #[test]
    fn an_exited_container_cannot_become_unknown() {
        assert_eq!(illegal(exited().mark_unknown("x")), ("exited", Action::MarkUnknown));
        let mut c = unknown();
        c.mark_unknown("again").unwrap();
        assert_eq!(c.message(), "again");
    }

    #[test]
    fn an_unknown_container_seen_running_resumes_with_its_pid() {
        let mut c = unknown();
        c.resume(77, 9_000);
        assert_eq!((c.state(), c.pid, c.started_at(), c.reason()), (ContainerState::Running, Some(77), 3_000, ""));
    }

    #[test]
    fn cri_states_match_the_protocol_values() {
        assert_eq!(ContainerState::Created.to_cri() as i32, 0);
        assert_eq!(ContainerState::Running.to_cri() as i32, 1);
        assert_eq!(ContainerState::Exited.to_cri() as i32, 2);
        assert_eq!(ContainerState::Unknown.to_cri() as i32, 3);
    }
}
