//! A pod sandbox's record: what RunPodSandbox asked for, what the runtime set up for it, and its
//! lifecycle `Creating → Ready → NotReady` with the guards of each verb.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_cri::v1 as cri;
use serde::{Deserialize, Serialize};

use super::disk::decode_config;
use super::error::{Action, Kind, StateError};

/// The CRI `PodSandboxMetadata`: together these name a sandbox uniquely.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SandboxMetadata {
    pub name: String,
    pub uid: String,
    pub namespace: String,
    pub attempt: u32,
}

/// A sandbox's lifecycle. CRI knows only READY and NOTREADY; `Creating` is reported as NOTREADY.
///
/// ```text
/// () ──create──▶ Creating ──mark_ready──▶ Ready ──stop──▶ NotReady ──remove──▶ ()
///                    └──────────stop──────────────────────▲   (stop of NotReady: no-op)
/// ```
/// A sandbox never becomes ready again once stopped (kubelet creates a new one). Remove is allowed
/// in every state once its containers are gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Recorded, name reserved, being set up (namespaces, network, infra process).
    Creating,
    Ready,
    /// Stopped, or its setup was interrupted; the default of a record missing its state.
    #[default]
    NotReady,
}

impl SandboxState {
    /// `mark_ready` applies only to a sandbox being created.
    pub fn can_mark_ready(self) -> bool {
        self == SandboxState::Creating
    }

    /// Whether stop has something to do; stopping a `NotReady` sandbox succeeds doing nothing.
    pub fn can_stop(self) -> bool {
        matches!(self, SandboxState::Creating | SandboxState::Ready)
    }

    /// Containers are created and started only in a ready sandbox.
    pub fn can_run_containers(self) -> bool {
        self == SandboxState::Ready
    }

    /// Remove is allowed in every state (the RPC layer stops first); containers must be gone.
    pub fn can_remove(self) -> bool {
        true
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Creating => "creating",
            SandboxState::Ready => "ready",
            SandboxState::NotReady => "not ready",
        }
    }

    pub fn to_cri(self) -> cri::PodSandboxState {
        match self {
            SandboxState::Ready => cri::PodSandboxState::SandboxReady,
            SandboxState::Creating | SandboxState::NotReady => cri::PodSandboxState::SandboxNotready,
        }
    }
}

/// The sandbox's namespace modes from `linux.security_context.namespace_options` (CRI
/// `NamespaceMode` values: 0 POD, 1 CONTAINER, 2 NODE, 3 TARGET); kubelet reads them back from
/// PodSandboxStatus to tell host-network pods apart.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NamespaceModes {
    pub network: i32,
    pub pid: i32,
    pub ipc: i32,
    pub target_id: String,
}

impl NamespaceModes {
    pub fn host_network(&self) -> bool {
        self.network == cri::NamespaceMode::Node as i32
    }
}

/// Everything the runtime keeps about one pod sandbox, stored as `sandboxes/<id>/sandbox.json`.
///
/// Fields the RPC layer fills in as it sets the sandbox up are public; the state changes only
/// through the guarded transitions. New fields must be `#[serde(default)]`-compatible (the whole
/// struct is), so older files keep loading.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SandboxRecord {
    pub id: String,
    pub metadata: SandboxMetadata,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The resolved handler name (never `""`): its config decides the OCI runtime.
    pub runtime_handler: String,
    state: SandboxState,
    /// Nanoseconds since the epoch.
    pub created_at: i64,
    /// The network namespace the containers join; `None` with host networking or until set up.
    pub netns_path: Option<PathBuf>,
    /// Pod IPs, primary first.
    pub ips: Vec<String>,
    pub log_directory: String,
    pub hostname: String,
    pub cgroup_parent: String,
    pub namespaces: NamespaceModes,
    /// The infra (pause) process, for handlers that run one.
    pub infra_pid: Option<i32>,
    /// The infra process's monitor, if it has one.
    pub monitor_pid: Option<i32>,
    /// The `PodSandboxConfig` as RunPodSandbox received it (k8s-cri's serde form); see
    /// [`SandboxRecord::pod_config`].
    pub config: serde_json::Value,
}

impl SandboxRecord {
    /// A new record in state `Creating` with a fresh id, from RunPodSandbox's config and the
    /// resolved handler. The config must carry metadata with a name.
    pub fn new(config: &cri::PodSandboxConfig, runtime_handler: &str, created_at: i64) -> Result<Self, StateError> {
        let invalid = |reason| StateError::Invalid { kind: Kind::Sandbox, reason };
        let m = config.metadata.as_ref().ok_or(invalid("the config has no metadata"))?;
        if m.name.is_empty() {
            return Err(invalid("the metadata has no name"));
        }
        let linux = config.linux.as_ref();
        let ns = linux.and_then(|l| l.security_context.as_ref()).and_then(|s| s.namespace_options.as_ref());
        Ok(SandboxRecord {
            id: super::new_id(),
            metadata: SandboxMetadata {
                name: m.name.clone(),
                uid: m.uid.clone(),
                namespace: m.namespace.clone(),
                attempt: m.attempt,
            },
            labels: config.labels.clone().into_iter().collect(),
            annotations: config.annotations.clone().into_iter().collect(),
            runtime_handler: runtime_handler.to_string(),
            state: SandboxState::Creating,
            created_at,
            netns_path: None,
            ips: Vec::new(),
            log_directory: config.log_directory.clone(),
            hostname: config.hostname.clone(),
            cgroup_parent: linux.map(|l| l.cgroup_parent.clone()).unwrap_or_default(),
            namespaces: ns
                .map(|n| NamespaceModes { network: n.network, pid: n.pid, ipc: n.ipc, target_id: n.target_id.clone() })
                .unwrap_or_default(),
            infra_pid: None,
            monitor_pid: None,
            config: serde_json::to_value(config).expect("a CRI config serializes"),
        })
    }

    pub fn state(&self) -> SandboxState {
        self.state
    }

    /// The key that must be unique among sandboxes: (name, namespace, uid, attempt).
    pub fn reservation_key(&self) -> String {
        let m = &self.metadata;
        serde_json::to_string(&(&m.name, &m.namespace, &m.uid, m.attempt)).expect("strings serialize")
    }

    /// The reserved name as containerd spells it: `name_namespace_uid_attempt`.
    pub fn display_name(&self) -> String {
        let m = &self.metadata;
        format!("{}_{}_{}_{}", m.name, m.namespace, m.uid, m.attempt)
    }

    /// `Ok` if the state allows `action`, else the `IllegalTransition` naming it.
    pub fn ensure(&self, action: Action) -> Result<(), StateError> {
        let allowed = match action {
            Action::MarkReady => self.state.can_mark_ready(),
            Action::Stop => true,
            Action::Remove => self.state.can_remove(),
            Action::CreateContainerIn | Action::StartContainerIn => self.state.can_run_containers(),
            Action::Start | Action::MarkExited | Action::MarkUnknown => false,
        };
        if allowed {
            Ok(())
        } else {
            Err(StateError::IllegalTransition {
                kind: Kind::Sandbox,
                id: self.id.clone(),
                from: self.state.as_str(),
                action,
            })
        }
    }

    /// `Creating → Ready`, once setup has finished.
    pub fn mark_ready(&mut self) -> Result<(), StateError> {
        self.ensure(Action::MarkReady)?;
        self.state = SandboxState::Ready;
        Ok(())
    }

    /// `Creating | Ready → NotReady`; idempotent. Returns whether the state changed.
    pub fn stop(&mut self) -> bool {
        let changed = self.state.can_stop();
        self.state = SandboxState::NotReady;
        changed
    }

    /// The stored `PodSandboxConfig`, decoded with top-level fields that a newer k8s-cri added
    /// filled with their defaults.
    pub fn pod_config(&self) -> Result<cri::PodSandboxConfig, StateError> {
        decode_config(&self.config).map_err(|source| StateError::Decode {
            kind: Kind::Sandbox,
            id: self.id.clone(),
            source,
        })
    }

    fn cri_metadata(&self) -> cri::PodSandboxMetadata {
        let m = &self.metadata;
        cri::PodSandboxMetadata {
            name: m.name.clone(),
            uid: m.uid.clone(),
            namespace: m.namespace.clone(),
            attempt: m.attempt,
        }
    }

    /// The ListPodSandbox item.
    pub fn to_cri(&self) -> cri::PodSandbox {
        cri::PodSandbox {
            id: self.id.clone(),
            metadata: Some(self.cri_metadata()),
            state: self.state.to_cri() as i32,
            created_at: self.created_at,
            labels: self.labels.clone().into_iter().collect(),
            annotations: self.annotations.clone().into_iter().collect(),
            runtime_handler: self.runtime_handler.clone(),
        }
    }

    /// The PodSandboxStatus, without the verbose info the RPC layer adds.
    pub fn to_cri_status(&self) -> cri::PodSandboxStatus {
        let network = (!self.namespaces.host_network()).then(|| {
            let mut ips = self.ips.iter();
            cri::PodSandboxNetworkStatus {
                ip: ips.next().cloned().unwrap_or_default(),
                additional_ips: ips.map(|ip| cri::PodIp { ip: ip.clone() }).collect(),
            }
        });
        let n = &self.namespaces;
        let options = cri::NamespaceOption {
            network: n.network,
            pid: n.pid,
            ipc: n.ipc,
            target_id: n.target_id.clone(),
            userns_options: None,
        };
        cri::PodSandboxStatus {
            id: self.id.clone(),
            metadata: Some(self.cri_metadata()),
            state: self.state.to_cri() as i32,
            created_at: self.created_at,
            network,
            linux: Some(cri::LinuxPodSandboxStatus { namespaces: Some(cri::Namespace { options: Some(options) }) }),
            labels: self.labels.clone().into_iter().collect(),
            annotations: self.annotations.clone().into_iter().collect(),
            runtime_handler: self.runtime_handler.clone(),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;

    use super::*;

    pub(crate) fn pod_config(name: &str, attempt: u32) -> cri::PodSandboxConfig {
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.into(),
                uid: format!("uid-{name}"),
                namespace: "default".into(),
                attempt,
            }),
            hostname: name.into(),
            log_directory: format!("/var/log/pods/{name}"),
            labels: HashMap::from([("app".into(), name.into()), ("tier".into(), "web".into())]),
            annotations: HashMap::from([("note".into(), "kept as given".into())]),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: "/kubepods/besteffort".into(),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption { pid: 1, ..Default::default() }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub(crate) fn sandbox(name: &str) -> SandboxRecord {
        SandboxRecord::new(&pod_config(name, 0), "runc", 1_000).unwrap()
    }

    fn illegal(r: Result<(), StateError>) -> (&'static str, Action) {
        match r {
            Err(StateError::IllegalTransition { kind: Kind::Sandbox, from, action, .. }) => (from, action),
            other => panic!("expected an illegal transition, got {other:?}"),
        }
    }

    #[test]
    fn a_new_sandbox_is_creating_and_carries_its_config() {
        let s = sandbox("web");
        assert_eq!(s.state(), SandboxState::Creating);
        assert!(crate::state::is_valid_id(&s.id));
        assert_eq!(s.metadata.uid, "uid-web");
        assert_eq!(s.cgroup_parent, "/kubepods/besteffort");
        assert_eq!(s.namespaces.pid, 1);
        assert_eq!(s.pod_config().unwrap(), pod_config("web", 0));
        assert_eq!(s.to_cri().state, cri::PodSandboxState::SandboxNotready as i32);
    }

    #[test]
    fn a_config_without_metadata_or_name_is_invalid() {
        let mut c = pod_config("web", 0);
        c.metadata.as_mut().unwrap().name.clear();
        assert!(matches!(SandboxRecord::new(&c, "runc", 1), Err(StateError::Invalid { .. })));
        c.metadata = None;
        assert!(matches!(SandboxRecord::new(&c, "runc", 1), Err(StateError::Invalid { .. })));
    }

    #[test]
    fn creating_becomes_ready_once_and_never_again_after_stop() {
        let mut s = sandbox("web");
        s.mark_ready().unwrap();
        assert_eq!(s.state(), SandboxState::Ready);
        assert_eq!(s.to_cri().state, cri::PodSandboxState::SandboxReady as i32);
        assert_eq!(illegal(s.mark_ready()), ("ready", Action::MarkReady));
        assert!(s.stop());
        assert_eq!(illegal(s.mark_ready()), ("not ready", Action::MarkReady));
    }

    #[test]
    fn stop_is_idempotent_from_every_state() {
        let mut s = sandbox("web");
        assert!(s.stop(), "creating → not ready");
        assert!(!s.stop(), "not ready stays not ready");
        let mut s = sandbox("web");
        s.mark_ready().unwrap();
        assert!(s.stop(), "ready → not ready");
        assert_eq!(s.state(), SandboxState::NotReady);
        assert!(s.ensure(Action::Stop).is_ok());
    }

    #[test]
    fn remove_is_allowed_in_every_state() {
        let mut s = sandbox("web");
        assert!(s.ensure(Action::Remove).is_ok());
        s.mark_ready().unwrap();
        assert!(s.ensure(Action::Remove).is_ok());
        s.stop();
        assert!(s.ensure(Action::Remove).is_ok());
    }

    #[test]
    fn containers_are_created_and_started_only_in_a_ready_sandbox() {
        let mut s = sandbox("web");
        assert_eq!(illegal(s.ensure(Action::CreateContainerIn)), ("creating", Action::CreateContainerIn));
        s.mark_ready().unwrap();
        assert!(s.ensure(Action::CreateContainerIn).is_ok());
        assert!(s.ensure(Action::StartContainerIn).is_ok());
        s.stop();
        assert_eq!(illegal(s.ensure(Action::StartContainerIn)), ("not ready", Action::StartContainerIn));
    }

    #[test]
    fn container_verbs_are_never_legal_on_a_sandbox() {
        let s = sandbox("web");
        assert_eq!(illegal(s.ensure(Action::Start)), ("creating", Action::Start));
        assert_eq!(illegal(s.ensure(Action::MarkExited)), ("creating", Action::MarkExited));
    }

    #[test]
    fn status_reports_ips_primary_first_and_namespace_modes() {
        let mut s = sandbox("web");
        s.ips = vec!["10.88.0.5".into(), "fd00::5".into()];
        let st = s.to_cri_status();
        let net = st.network.unwrap();
        assert_eq!(net.ip, "10.88.0.5");
        assert_eq!(net.additional_ips, vec![cri::PodIp { ip: "fd00::5".into() }]);
        let opts = st.linux.unwrap().namespaces.unwrap().options.unwrap();
        assert_eq!(opts.pid, 1);
        assert_eq!(st.labels.get("app").map(String::as_str), Some("web"));
    }

    #[test]
    fn host_network_sandboxes_report_no_network_status() {
        let mut s = sandbox("web");
        s.namespaces.network = cri::NamespaceMode::Node as i32;
        assert!(s.to_cri_status().network.is_none());
    }

    #[test]
    fn reserved_names_do_not_collide_through_underscores() {
        let mut a = sandbox("a_b");
        a.metadata.namespace = "c".into();
        a.metadata.uid = "u".into();
        let mut b = sandbox("a");
        b.metadata.namespace = "b_c".into();
        b.metadata.uid = "u".into();
        assert_eq!(a.display_name(), b.display_name());
        assert_ne!(a.reservation_key(), b.reservation_key());
    }
}
