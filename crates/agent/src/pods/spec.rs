//! What CRI is told about a pod: its `PodSandboxConfig` and each container's `ContainerConfig`,
//! built from the pod spec as kubelet builds them (standard labels and annotations included).
//!
//! Pure: environment, mounts and the pulled image come in resolved.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1 as core;

use super::dns::{self, NodeDns};
use super::labels;
use super::resources;

/// `<log_root>/<namespace>_<name>_<uid>`, kubelet's pod log directory.
pub fn pod_log_directory(log_root: &Path, namespace: &str, name: &str, uid: &str) -> PathBuf {
    log_root.join(format!("{namespace}_{name}_{uid}"))
}

/// The container's log file relative to the pod's log directory: `<name>/<restartCount>.log`.
pub fn container_log_path(container: &str, restart_count: i32) -> String {
    format!("{container}/{restart_count}.log")
}

/// The pod's identity, as the worker knows it.
pub fn metadata(pod: &core::Pod) -> (&str, &str, &str) {
    let m = &pod.metadata;
    (m.name.as_deref().unwrap_or(""), m.namespace.as_deref().unwrap_or("default"), m.uid.as_deref().unwrap_or(""))
}

fn spec(pod: &core::Pod) -> &core::PodSpec {
    static EMPTY: std::sync::OnceLock<core::PodSpec> = std::sync::OnceLock::new();
    pod.spec.as_ref().unwrap_or_else(|| EMPTY.get_or_init(core::PodSpec::default))
}

/// The CRI namespace modes of the pod: host network/PID/IPC or the pod's own.
pub fn namespace_options(spec: &core::PodSpec) -> cri::NamespaceOption {
    let node_or = |host: Option<bool>, otherwise: cri::NamespaceMode| {
        if host == Some(true) { cri::NamespaceMode::Node as i32 } else { otherwise as i32 }
    };
    let pid_default = if spec.share_process_namespace == Some(true) {
        cri::NamespaceMode::Pod
    } else {
        cri::NamespaceMode::Container
    };
    cri::NamespaceOption {
        network: node_or(spec.host_network, cri::NamespaceMode::Pod),
        pid: node_or(spec.host_pid, pid_default),
        ipc: node_or(spec.host_ipc, cri::NamespaceMode::Pod),
        ..Default::default()
    }
}

/// The pod's hostname: `spec.hostname` or the pod name, cut to a DNS label (63 characters) the
/// way kubelet does, without a trailing `-` or `.`.
pub fn hostname(pod: &core::Pod) -> String {
    let (name, _, _) = metadata(pod);
    let h = spec(pod).hostname.as_deref().filter(|h| !h.is_empty()).unwrap_or(name);
    if h.len() <= 63 {
        return h.to_string();
    }
    h[..63].trim_end_matches(['-', '.']).to_string()
}

fn seccomp(profile: Option<&core::SeccompProfile>) -> Option<cri::SecurityProfile> {
    use cri::security_profile::ProfileType;
    // kubelet without --seccomp-default runs unconfined when nothing is asked for.
    let Some(p) = profile else {
        return Some(cri::SecurityProfile {
            profile_type: ProfileType::Unconfined as i32,
            localhost_ref: String::new(),
        });
    };
    let (ty, local) = match p.type_.as_str() {
        "RuntimeDefault" => (ProfileType::RuntimeDefault, String::new()),
        "Localhost" => (ProfileType::Localhost, p.localhost_profile.clone().unwrap_or_default()),
        _ => (ProfileType::Unconfined, String::new()),
    };
    Some(cri::SecurityProfile { profile_type: ty as i32, localhost_ref: local })
}

fn supplemental_groups(spec: &core::PodSpec) -> Vec<i64> {
    let sc = spec.security_context.as_ref();
    let mut groups: Vec<i64> = sc.and_then(|s| s.fs_group).into_iter().collect();
    groups.extend(sc.and_then(|s| s.supplemental_groups.clone()).into_iter().flatten());
    groups.dedup();
    groups
}

fn any_privileged(spec: &core::PodSpec) -> bool {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| c.security_context.as_ref().and_then(|s| s.privileged) == Some(true))
}

/// The sandbox configuration of the pod's `attempt`-th sandbox, in `cgroup_parent` (the pod's
/// cgroup; empty leaves it to the runtime).
pub fn sandbox_config(
    pod: &core::Pod,
    attempt: u32,
    log_root: &Path,
    dns: &NodeDns,
    cgroup_parent: &str,
) -> cri::PodSandboxConfig {
    let (name, namespace, uid) = metadata(pod);
    let spec = spec(pod);
    let psc = spec.security_context.as_ref();
    let port_mappings = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.unwrap_or(0) != 0)
        .map(|p| cri::PortMapping {
            protocol: protocol(p.protocol.as_deref()) as i32,
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or(0),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect();
    let sysctls =
        psc.and_then(|s| s.sysctls.as_ref()).into_iter().flatten().map(|s| (s.name.clone(), s.value.clone())).collect();
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.to_string(),
            uid: uid.to_string(),
            namespace: namespace.to_string(),
            attempt,
        }),
        hostname: hostname(pod),
        log_directory: pod_log_directory(log_root, namespace, name, uid).display().to_string(),
        dns_config: Some(dns::dns_config(spec, namespace, dns)),
        port_mappings,
        labels: node_label(pod, labels::sandbox_labels(pod.metadata.labels.as_ref(), name, namespace, uid)),
        annotations: pod.metadata.annotations.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.to_string(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(spec)),
                run_as_user: psc.and_then(|s| s.run_as_user).map(|value| cri::Int64Value { value }),
                run_as_group: psc.and_then(|s| s.run_as_group).map(|value| cri::Int64Value { value }),
                supplemental_groups: supplemental_groups(spec),
                privileged: any_privileged(spec),
                seccomp: seccomp(psc.and_then(|s| s.seccomp_profile.as_ref())),
                ..Default::default()
            }),
            sysctls,
            overhead: resources::overhead(spec),
            resources: resources::pod_resources(spec),
        }),
        windows: None,
    }
}

/// `labels` plus the node the pod is bound to.
fn node_label(pod: &core::Pod, mut labels: HashMap<String, String>) -> HashMap<String, String> {
    if let Some(node) = spec(pod).node_name.as_deref().filter(|n| !n.is_empty()) {
        labels.insert(labels::NODE.to_string(), node.to_string());
    }
    labels
}

fn protocol(p: Option<&str>) -> cri::Protocol {
    match p {
        Some("UDP") => cri::Protocol::Udp,
        Some("SCTP") => cri::Protocol::Sctp,
        _ => cri::Protocol::Tcp,
    }
}

/// Everything about one container that is not in its spec.
pub struct ContainerInputs<'a> {
    pub pod: &'a core::Pod,
    pub container: &'a core::Container,
    pub init: bool,
    pub restart_count: i32,
    /// The pulled image's reference (its ID) and the handler it was pulled for.
    pub image_ref: &'a str,
    pub handler: &'a str,
    pub env: Vec<cri::KeyValue>,
    pub mounts: Vec<cri::Mount>,
    /// The host file mounted at the termination message path, if any.
    pub termination_message_file: Option<PathBuf>,
    pub qos: &'a str,
    pub memory_capacity: i64,
}

/// A hash of what of the container's spec may change on a running pod and needs a new
/// container when it does — its image (resources are resized in place, not restarted for) —
/// recorded as kubelet records its hash.
pub fn container_hash(c: &core::Container) -> String {
    // FNV-1a: stable across runs and platforms.
    let json = serde_json::to_vec(&(&c.name, &c.image)).unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in json {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{:x}", h as u32)
}

/// The CRI configuration of one container of the pod.
pub fn container_config(i: ContainerInputs<'_>) -> cri::ContainerConfig {
    let (name, namespace, uid) = metadata(i.pod);
    let spec = spec(i.pod);
    let c = i.container;
    let csc = c.security_context.as_ref();
    let psc = spec.security_context.as_ref();
    let mut mounts = i.mounts;
    let termination_path = c.termination_message_path.clone().unwrap_or_else(|| "/dev/termination-log".into());
    if let Some(file) = &i.termination_message_file {
        mounts.push(cri::Mount {
            container_path: termination_path.clone(),
            host_path: file.display().to_string(),
            ..Default::default()
        });
    }
    let mut annotations = HashMap::from([
        (labels::CONTAINER_HASH.to_string(), container_hash(c)),
        (labels::CONTAINER_RESTART_COUNT.to_string(), i.restart_count.to_string()),
        (labels::CONTAINER_TERMINATION_MESSAGE_PATH.to_string(), termination_path),
        (
            labels::CONTAINER_TERMINATION_MESSAGE_POLICY.to_string(),
            c.termination_message_policy.clone().unwrap_or_else(|| "File".into()),
        ),
        (
            labels::POD_TERMINATION_GRACE_PERIOD.to_string(),
            spec.termination_grace_period_seconds.unwrap_or(30).to_string(),
        ),
    ]);
    if let Some(pre_stop) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
        annotations
            .insert(labels::CONTAINER_PRE_STOP_HANDLER.into(), serde_json::to_string(pre_stop).unwrap_or_default());
    }
    if let Some(ports) = c.ports.as_ref().filter(|p| !p.is_empty()) {
        annotations.insert(labels::CONTAINER_PORTS.into(), serde_json::to_string(ports).unwrap_or_default());
    }
    if let Some(file) = &i.termination_message_file {
        annotations.insert(labels::CONTAINER_TERMINATION_MESSAGE_FILE.into(), file.display().to_string());
    }
    if i.init {
        annotations.insert(labels::CONTAINER_KIND.into(), "init".into());
    }
    let capabilities = csc.and_then(|s| s.capabilities.as_ref()).map(|caps| cri::Capability {
        add_capabilities: caps.add.clone().unwrap_or_default(),
        drop_capabilities: caps.drop.clone().unwrap_or_default(),
        ..Default::default()
    });
    let run_as_user = csc.and_then(|s| s.run_as_user).or(psc.and_then(|s| s.run_as_user));
    let run_as_group = csc.and_then(|s| s.run_as_group).or(psc.and_then(|s| s.run_as_group));
    let security_context = cri::LinuxContainerSecurityContext {
        capabilities,
        privileged: csc.and_then(|s| s.privileged) == Some(true),
        namespace_options: Some(namespace_options(spec)),
        run_as_user: run_as_user.map(|value| cri::Int64Value { value }),
        run_as_group: run_as_group.map(|value| cri::Int64Value { value }),
        readonly_rootfs: csc.and_then(|s| s.read_only_root_filesystem) == Some(true),
        supplemental_groups: supplemental_groups(spec),
        no_new_privs: csc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        seccomp: seccomp(csc.and_then(|s| s.seccomp_profile.as_ref()).or(psc.and_then(|s| s.seccomp_profile.as_ref()))),
        ..Default::default()
    };
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata { name: c.name.clone(), attempt: i.restart_count.max(0) as u32 }),
        image: Some(cri::ImageSpec {
            image: i.image_ref.to_string(),
            user_specified_image: c.image.clone().unwrap_or_default(),
            runtime_handler: i.handler.to_string(),
            ..Default::default()
        }),
        command: super::env::expand_all(c.command.as_ref(), &i.env),
        args: super::env::expand_all(c.args.as_ref(), &i.env),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: i.env,
        mounts,
        labels: node_label(i.pod, labels::container_labels(&c.name, name, namespace, uid)),
        annotations,
        log_path: container_log_path(&c.name, i.restart_count),
        stdin: c.stdin == Some(true),
        stdin_once: c.stdin_once == Some(true),
        tty: c.tty == Some(true),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(resources::container_resources(c, i.qos, i.memory_capacity)),
            security_context: Some(security_context),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;

    fn pod() -> core::Pod {
        core::Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("prod".into()),
                uid: Some("u-1".into()),
                labels: Some(BTreeMap::from([("app".into(), "web".into())])),
                annotations: Some(BTreeMap::from([("note".into(), "x".into())])),
                ..Default::default()
            },
            spec: Some(core::PodSpec {
                node_name: Some("node-a".into()),
                containers: vec![core::Container {
                    name: "app".into(),
                    image: Some("busybox".into()),
                    command: Some(vec!["sh".into(), "-c".into()]),
                    args: Some(vec!["echo $(GREETING)".into()]),
                    ports: Some(vec![
                        core::ContainerPort { container_port: 80, host_port: Some(8080), ..Default::default() },
                        core::ContainerPort { container_port: 53, protocol: Some("UDP".into()), ..Default::default() },
                    ]),
                    security_context: Some(core::SecurityContext {
                        allow_privilege_escalation: Some(false),
                        capabilities: Some(core::Capabilities { add: Some(vec!["NET_ADMIN".into()]), drop: None }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                share_process_namespace: Some(true),
                security_context: Some(core::PodSecurityContext {
                    run_as_user: Some(1000),
                    fs_group: Some(2000),
                    supplemental_groups: Some(vec![3000]),
                    sysctls: Some(vec![core::Sysctl { name: "net.ipv4.ip_forward".into(), value: "1".into() }]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn the_sandbox_carries_kubelets_identity_labels_log_directory_and_namespaces() {
        let host = NodeDns {
            host: dns::HostDns { servers: vec!["10.0.0.2".into()], ..Default::default() },
            ..Default::default()
        };
        let cfg = sandbox_config(&pod(), 2, Path::new("/var/log/pods"), &host, "/kubepods/burstable/podu-1");
        let m = cfg.metadata.as_ref().unwrap();
        assert_eq!((m.name.as_str(), m.namespace.as_str(), m.uid.as_str(), m.attempt), ("web", "prod", "u-1", 2));
        assert_eq!(cfg.hostname, "web");
        assert_eq!(cfg.log_directory, "/var/log/pods/prod_web_u-1");
        assert_eq!(cfg.labels[labels::POD_NAME], "web");
        assert_eq!(cfg.labels[labels::POD_NAMESPACE], "prod");
        assert_eq!(cfg.labels[labels::POD_UID], "u-1");
        assert_eq!(cfg.labels[labels::NODE], "node-a");
        assert_eq!(cfg.labels["app"], "web");
        assert_eq!(cfg.annotations["note"], "x");
        assert_eq!(cfg.dns_config.unwrap().servers, vec!["10.0.0.2"]);
        assert_eq!(cfg.port_mappings.len(), 1, "only ports with a host port are mapped");
        assert_eq!((cfg.port_mappings[0].container_port, cfg.port_mappings[0].host_port), (80, 8080));
        let linux = cfg.linux.unwrap();
        assert_eq!(linux.cgroup_parent, "/kubepods/burstable/podu-1");
        assert_eq!(linux.sysctls["net.ipv4.ip_forward"], "1");
        let sc = linux.security_context.unwrap();
        let ns = sc.namespace_options.unwrap();
        assert_eq!(ns.network, cri::NamespaceMode::Pod as i32);
        assert_eq!(ns.pid, cri::NamespaceMode::Pod as i32, "shareProcessNamespace");
        assert_eq!(sc.run_as_user.unwrap().value, 1000);
        assert_eq!(sc.supplemental_groups, vec![2000, 3000]);
    }

    #[test]
    fn host_namespaces_map_to_node_mode() {
        let mut p = pod();
        let spec = p.spec.as_mut().unwrap();
        (spec.host_network, spec.host_pid, spec.host_ipc) = (Some(true), Some(true), Some(true));
        let ns = namespace_options(spec);
        assert_eq!((ns.network, ns.pid, ns.ipc), (2, 2, 2));
        spec.share_process_namespace = None;
        spec.host_pid = None;
        assert_eq!(namespace_options(spec).pid, cri::NamespaceMode::Container as i32);
    }

    #[test]
    fn long_pod_names_are_cut_to_a_dns_label_for_the_hostname() {
        let mut p = pod();
        p.metadata.name = Some(format!("{}-{}", "a".repeat(62), "b"));
        assert_eq!(hostname(&p), "a".repeat(62));
    }

    #[test]
    fn a_container_gets_the_standard_labels_restart_annotations_log_path_and_expanded_args() {
        let p = pod();
        let c = &p.spec.as_ref().unwrap().containers[0];
        let cfg = container_config(ContainerInputs {
            pod: &p,
            container: c,
            init: false,
            restart_count: 3,
            image_ref: "sha256:abc",
            handler: "gvisor",
            env: vec![cri::KeyValue { key: "GREETING".into(), value: "hi".into() }],
            mounts: vec![],
            termination_message_file: Some(PathBuf::from("/var/lib/berth/pods/u-1/containers/app/3")),
            qos: "BestEffort",
            memory_capacity: 1 << 30,
        });
        assert_eq!(cfg.metadata.as_ref().unwrap().attempt, 3);
        assert_eq!(cfg.log_path, "app/3.log");
        assert_eq!(cfg.labels[labels::CONTAINER_NAME], "app");
        assert_eq!(cfg.labels[labels::POD_UID], "u-1");
        assert_eq!(cfg.labels[labels::NODE], "node-a");
        assert_eq!(cfg.annotations[labels::CONTAINER_RESTART_COUNT], "3");
        assert_eq!(cfg.annotations[labels::CONTAINER_TERMINATION_MESSAGE_PATH], "/dev/termination-log");
        let image = cfg.image.unwrap();
        assert_eq!((image.image.as_str(), image.runtime_handler.as_str()), ("sha256:abc", "gvisor"));
        assert_eq!(image.user_specified_image, "busybox");
        assert_eq!(cfg.args, vec!["echo hi"]);
        assert_eq!(cfg.mounts[0].container_path, "/dev/termination-log");
        let sc = cfg.linux.unwrap().security_context.unwrap();
        assert!(sc.no_new_privs);
        assert_eq!(sc.capabilities.unwrap().add_capabilities, vec!["NET_ADMIN"]);
        assert_eq!(sc.run_as_user.unwrap().value, 1000, "the pod's runAsUser applies");
    }

    #[test]
    fn the_container_hash_changes_with_the_spec() {
        let p = pod();
        let mut c = p.spec.as_ref().unwrap().containers[0].clone();
        let before = container_hash(&c);
        assert_eq!(before, container_hash(&c));
        c.resources = Some(core::ResourceRequirements::default());
        assert_eq!(before, container_hash(&c), "a resize is not a new container");
        c.image = Some("busybox:2".into());
        assert_ne!(before, container_hash(&c));
    }
}
