//! Unit tests of spec generation, on the generated JSON where the wire form matters.

use super::*;
use serde_json::{Value, json};

/// This VM's bounding set: everything up to CAP_CHECKPOINT_RESTORE except CAP_SYS_RESOURCE.
const BOUNDING_WITHOUT_SYS_RESOURCE: u64 = 0x01ff_feff_ffff;

fn host() -> HostInfo {
    HostInfo {
        min_oom_score_adj: 0,
        nofile_limit: 20000,
        bounding_caps: BOUNDING_WITHOUT_SYS_RESOURCE,
        devices: Vec::new(),
    }
}

fn base() -> ContainerSpec {
    ContainerSpec {
        id: "c1".into(),
        pod_id: "pod1".into(),
        rootfs: "/var/lib/berth/c1/rootfs".into(),
        image: ImageConfig { cmd: vec!["sleep".into(), "3600".into()], ..Default::default() },
        hostname: Some("web-0".into()),
        ..Default::default()
    }
}

fn json_of(c: &ContainerSpec) -> Value {
    serde_json::to_value(container_spec_on(c, &host()).unwrap()).unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_owned()).collect()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn mount<'a>(spec: &'a Value, destination: &str) -> Option<&'a Value> {
    spec["mounts"].as_array().unwrap().iter().find(|m| m["destination"] == destination)
}

#[test]
fn a_plain_container_gets_the_kubernetes_defaults() {
    let s = json_of(&base());
    assert_eq!(s["ociVersion"], "1.0.2-dev");
    assert_eq!(s["root"], json!({"path": "/var/lib/berth/c1/rootfs", "readonly": false}));
    assert_eq!(s["hostname"], "web-0");
    let p = &s["process"];
    assert_eq!(strings(&p["args"]), ["sleep", "3600"]);
    assert_eq!(p["cwd"], "/");
    assert_eq!(p["terminal"], false);
    assert_eq!(p["noNewPrivileges"], false);
    assert_eq!(p["user"], json!({"uid": 0, "gid": 0, "additionalGids": [0]}));
    assert_eq!(
        strings(&p["env"]),
        ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME=web-0"]
    );
    assert_eq!(p["rlimits"], json!([{"type": "RLIMIT_NOFILE", "hard": 20000, "soft": 20000}]));
    assert_eq!(p["oomScoreAdj"], 0);
    let caps = sorted(strings(&p["capabilities"]["bounding"]));
    assert_eq!(caps.len(), 14);
    assert!(caps.contains(&"CAP_NET_RAW".to_owned()) && !caps.contains(&"CAP_SYS_ADMIN".to_owned()));
    assert_eq!(sorted(strings(&p["capabilities"]["effective"])), caps);
    assert!(p["capabilities"].get("ambient").is_none() && p["capabilities"].get("inheritable").is_none());

    let l = &s["linux"];
    let ns: Vec<_> = l["namespaces"].as_array().unwrap().iter().map(|n| n["type"].as_str().unwrap()).collect();
    assert_eq!(ns, ["pid", "ipc", "uts", "mount", "network", "cgroup"]);
    assert_eq!(l["cgroupsPath"], "/berth/pod1/c1");
    assert_eq!(strings(&l["maskedPaths"]), DEFAULT_MASKED_PATHS);
    assert_eq!(strings(&l["readonlyPaths"]), DEFAULT_READONLY_PATHS);
    assert_eq!(l["resources"]["devices"], json!([{"allow": false, "access": "rwm"}]));
    assert!(l.get("seccomp").is_none());
    assert!(l.get("devices").is_none_or(|d| d.as_array().unwrap().is_empty()));

    let dests: Vec<_> = s["mounts"].as_array().unwrap().iter().map(|m| m["destination"].as_str().unwrap()).collect();
    assert_eq!(dests, ["/proc", "/dev", "/dev/pts", "/dev/mqueue", "/sys", "/sys/fs/cgroup", "/dev/shm"]);
    assert_eq!(mount(&s, "/sys/fs/cgroup").unwrap()["type"], "cgroup");
    assert!(strings(&mount(&s, "/sys/fs/cgroup").unwrap()["options"]).contains(&"ro".to_owned()));
    assert!(strings(&mount(&s, "/sys").unwrap()["options"]).contains(&"ro".to_owned()));
}

#[test]
fn merge_command_follows_kubernetes_rules() {
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let (ep, cmd) = (v(&["/entry"]), v(&["--serve"]));
    assert_eq!(merge_command(&ep, &cmd, &[], &[]), ["/entry", "--serve"]);
    assert_eq!(merge_command(&ep, &cmd, &[], &v(&["--debug"])), ["/entry", "--debug"]);
    assert_eq!(merge_command(&ep, &cmd, &v(&["/bin/sh"]), &[]), ["/bin/sh"]);
    assert_eq!(merge_command(&ep, &cmd, &v(&["/bin/sh"]), &v(&["-c", "true"])), ["/bin/sh", "-c", "true"]);
    assert!(merge_command(&[], &[], &[], &[]).is_empty());
}

#[test]
fn a_container_without_any_command_is_rejected() {
    let c = ContainerSpec { image: ImageConfig::default(), ..base() };
    assert!(matches!(container_spec_on(&c, &host()), Err(SpecError::NoCommand)));
}

#[test]
fn cri_env_overrides_image_env_in_place_and_appends_new_keys() {
    let env = merge_env(
        &["PATH=/app/bin".into(), "MODE=prod".into(), "EMPTY".into()],
        &[("MODE".into(), "dev".into()), ("EXTRA".into(), "a=b".into())],
        None,
    );
    assert_eq!(env, ["PATH=/app/bin", "MODE=dev", "EMPTY=", "EXTRA=a=b"]);
}

#[test]
fn working_dir_comes_from_cri_then_the_image_and_must_be_absolute() {
    let mut c = base();
    c.image.working_dir = "/srv".into();
    assert_eq!(json_of(&c)["process"]["cwd"], "/srv");
    c.working_dir = Some("/work".into());
    assert_eq!(json_of(&c)["process"]["cwd"], "/work");
    c.working_dir = Some("rel".into());
    assert!(matches!(container_spec_on(&c, &host()), Err(SpecError::RelativeWorkingDir { .. })));
}

#[test]
fn the_image_user_is_resolved_against_the_rootfs_and_cri_overrides_it() {
    let rootfs = tempfile::tempdir().unwrap();
    std::fs::create_dir(rootfs.path().join("etc")).unwrap();
    std::fs::write(rootfs.path().join("etc/passwd"), "root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/:/bin/sh\n")
        .unwrap();
    std::fs::write(rootfs.path().join("etc/group"), "root:x:0:\napp:x:1000:\naudio:x:29:app\n").unwrap();
    let mut c = ContainerSpec { rootfs: rootfs.path().to_path_buf(), ..base() };
    c.image.user = "app".into();
    assert_eq!(json_of(&c)["process"]["user"], json!({"uid": 1000, "gid": 1000, "additionalGids": [29, 1000]}));
    c.user = UserConfig {
        run_as_user: Some(0),
        run_as_group: Some(7),
        supplemental_groups: vec![500],
        ..Default::default()
    };
    assert_eq!(json_of(&c)["process"]["user"], json!({"uid": 0, "gid": 7, "additionalGids": [7, 500]}));
    c.user = UserConfig::default();
    c.image.user = "ghost".into();
    assert!(matches!(container_spec_on(&c, &host()), Err(SpecError::User(UserError::UnknownUser { .. }))));
}

#[test]
fn capabilities_are_added_and_dropped_with_all_and_either_spelling() {
    let caps = |add: &[&str], drop: &[&str]| {
        let c = ContainerSpec {
            add_capabilities: add.iter().map(|s| s.to_string()).collect(),
            drop_capabilities: drop.iter().map(|s| s.to_string()).collect(),
            ..base()
        };
        sorted(strings(&json_of(&c)["process"]["capabilities"]["bounding"]))
    };
    let added = caps(&["NET_ADMIN", "cap_sys_time"], &["CAP_NET_RAW", "mknod"]);
    assert!(added.contains(&"CAP_NET_ADMIN".into()) && added.contains(&"CAP_SYS_TIME".into()));
    assert!(!added.contains(&"CAP_NET_RAW".into()) && !added.contains(&"CAP_MKNOD".into()));
    assert_eq!(caps(&["NET_BIND_SERVICE"], &["ALL"]), ["CAP_NET_BIND_SERVICE"]);
    assert!(caps(&[], &["all"]).is_empty());
    let all = caps(&["ALL"], &["SYS_ADMIN"]);
    assert_eq!(all.len(), 39, "41 capabilities minus CAP_SYS_RESOURCE (not held) minus CAP_SYS_ADMIN");
    let bad = ContainerSpec { add_capabilities: vec!["FLY".into()], ..base() };
    assert!(matches!(container_spec_on(&bad, &host()), Err(SpecError::InvalidCapability { name }) if name == "FLY"));
}

/// What this VM's runsc (0.0~20221219) does not do: it knows no capability after CAP_AUDIT_READ,
/// and ignores masked and read-only paths.
fn gvisor_2022() -> RuntimeGaps {
    RuntimeGaps {
        unsupported_capabilities: vec![Capability::Perfmon, Capability::Bpf, Capability::CheckpointRestore],
        ignores_masked_and_readonly_paths: true,
    }
}

/// Every capability set the spec fills, each sorted.
fn capability_sets(c: &ContainerSpec) -> Vec<Vec<String>> {
    let s = json_of(c);
    let caps = &s["process"]["capabilities"];
    ["bounding", "effective", "permitted"].iter().map(|set| sorted(strings(&caps[*set]))).collect()
}

#[test]
fn capabilities_the_runtime_does_not_support_are_left_out_of_all() {
    let c = ContainerSpec { add_capabilities: vec!["ALL".into()], runtime_gaps: gvisor_2022(), ..base() };
    for set in capability_sets(&c) {
        assert_eq!(set.len(), 37, "41 capabilities minus CAP_SYS_RESOURCE (not held) minus the three unsupported");
        assert!(set.contains(&"CAP_AUDIT_READ".into()) && set.contains(&"CAP_SYS_ADMIN".into()));
        for cap in ["CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE"] {
            assert!(!set.contains(&cap.into()), "{cap} in {set:?}");
        }
    }
}

#[test]
fn a_capability_the_runtime_does_not_support_is_left_out_even_when_added_by_name() {
    let c = ContainerSpec {
        add_capabilities: vec!["BPF".into(), "CAP_PERFMON".into(), "NET_ADMIN".into()],
        runtime_gaps: gvisor_2022(),
        ..base()
    };
    for set in capability_sets(&c) {
        assert!(set.contains(&"CAP_NET_ADMIN".into()));
        assert!(!set.contains(&"CAP_BPF".into()) && !set.contains(&"CAP_PERFMON".into()), "{set:?}");
    }
    let without_the_limit = ContainerSpec { runtime_gaps: RuntimeGaps::default(), ..c };
    assert!(capability_sets(&without_the_limit).iter().all(|set| set.contains(&"CAP_BPF".into())));
}

#[test]
fn a_privileged_container_gets_no_capability_the_runtime_does_not_support() {
    let c = ContainerSpec { privileged: true, runtime_gaps: gvisor_2022(), ..base() };
    for set in capability_sets(&c) {
        assert_eq!(set.len(), 37);
        assert!(!set.contains(&"CAP_CHECKPOINT_RESTORE".into()), "{set:?}");
    }
}

#[test]
fn the_default_seccomp_profile_denies_what_a_capability_the_runtime_does_not_support_would_allow() {
    let denied = |unsupported| {
        let c = ContainerSpec {
            add_capabilities: vec!["BPF".into()],
            seccomp: SeccompProfile::RuntimeDefault,
            runtime_gaps: unsupported,
            ..base()
        };
        let s = json_of(&c);
        let rules = s["linux"]["seccomp"]["syscalls"].as_array().unwrap().clone();
        rules.iter().filter(|r| r["action"] == "SCMP_ACT_ERRNO").flat_map(|r| strings(&r["names"])).collect::<Vec<_>>()
    };
    assert!(!denied(RuntimeGaps::default()).contains(&"bpf".into()), "CAP_BPF allows bpf(2)");
    assert!(denied(gvisor_2022()).contains(&"bpf".into()), "without CAP_BPF, bpf(2) is denied");
}

/// A rootfs with a file `/bin/ls`, directories `/tmp` and `/etc`, and `/link` → the host's `/etc`.
fn small_rootfs() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for d in ["bin", "tmp", "etc"] {
        std::fs::create_dir(dir.path().join(d)).unwrap();
    }
    std::fs::write(dir.path().join("bin/ls"), "").unwrap();
    std::os::unix::fs::symlink("/etc", dir.path().join("link")).unwrap();
    dir
}

/// The spec's mounts after the standard ones, as (destination, type, source, options).
fn extra_mounts(c: &ContainerSpec) -> Vec<(String, String, String, Vec<String>)> {
    let standard = json_of(&ContainerSpec { runtime_gaps: RuntimeGaps::default(), ..c.clone() })["mounts"]
        .as_array()
        .unwrap()
        .len();
    let s = json_of(c);
    s["mounts"].as_array().unwrap()[standard..]
        .iter()
        .map(|m| {
            let text = |k: &str| m[k].as_str().unwrap().to_owned();
            (text("destination"), text("type"), text("source"), strings(&m["options"]))
        })
        .collect()
}

#[test]
fn masked_and_readonly_paths_become_mounts_for_a_runtime_that_ignores_them() {
    let rootfs = small_rootfs();
    let c = ContainerSpec {
        rootfs: rootfs.path().to_path_buf(),
        masked_paths: Some(vec!["/bin/ls".into(), "/etc".into(), "/proc/kcore".into(), "/nope".into()]),
        readonly_paths: Some(vec!["/tmp".into(), "/sys/fs".into()]),
        runtime_gaps: gvisor_2022(),
        ..base()
    };
    let tmp = rootfs.path().join("tmp").to_string_lossy().into_owned();
    assert_eq!(
        extra_mounts(&c),
        [
            ("/bin/ls".into(), "bind".into(), "/dev/null".into(), vec!["rbind".into(), "ro".into()]),
            (
                "/etc".into(),
                "tmpfs".into(),
                "tmpfs".into(),
                ["ro", "nosuid", "nodev", "noexec"].map(String::from).to_vec()
            ),
            ("/tmp".into(), "bind".into(), tmp, ["rbind", "rprivate", "ro"].map(String::from).to_vec()),
        ],
        "paths under /proc and /sys are the runtime's own, and a missing path is skipped"
    );
    let s = json_of(&c);
    assert_eq!(strings(&s["linux"]["maskedPaths"]).len(), 4, "the spec's own fields are kept");
}

#[test]
fn a_masked_or_readonly_path_through_a_symlink_or_dotdot_is_not_resolved_on_the_host() {
    let rootfs = small_rootfs();
    let c = ContainerSpec {
        rootfs: rootfs.path().to_path_buf(),
        masked_paths: Some(vec!["/link/passwd".into(), "/tmp/../etc".into()]),
        readonly_paths: Some(vec!["/link".into(), "relative".into()]),
        runtime_gaps: gvisor_2022(),
        ..base()
    };
    assert_eq!(extra_mounts(&c), []);
}

#[test]
fn a_path_inside_a_volume_or_a_sandbox_file_is_not_masked_through_the_rootfs() {
    let rootfs = small_rootfs();
    let c = ContainerSpec {
        rootfs: rootfs.path().to_path_buf(),
        mounts: vec![Mount { container_path: "/tmp".into(), host_path: "/srv/volume".into(), ..Default::default() }],
        masked_paths: Some(vec!["/tmp".into()]),
        readonly_paths: Some(vec!["/tmp".into()]),
        runtime_gaps: gvisor_2022(),
        ..base()
    };
    assert_eq!(extra_mounts(&c), []);
}

#[test]
fn a_path_holding_a_sandbox_file_is_not_covered_by_a_mount_that_would_hide_it() {
    let rootfs = small_rootfs();
    let c = ContainerSpec {
        rootfs: rootfs.path().to_path_buf(),
        sandbox_files: SandboxFiles { hosts: Some("/run/berth/pod1/hosts".into()), ..Default::default() },
        masked_paths: Some(vec!["/etc".into()]),
        readonly_paths: Some(vec!["/etc".into(), "/tmp".into()]),
        runtime_gaps: gvisor_2022(),
        ..base()
    };
    let covered: Vec<String> = extra_mounts(&c).into_iter().map(|(destination, ..)| destination).collect();
    assert_eq!(covered, ["/tmp"]);
}

#[test]
fn a_runtime_that_applies_masked_and_readonly_paths_gets_no_mounts_for_them() {
    let rootfs = small_rootfs();
    let c = ContainerSpec {
        rootfs: rootfs.path().to_path_buf(),
        masked_paths: Some(vec!["/bin/ls".into()]),
        readonly_paths: Some(vec!["/tmp".into()]),
        ..base()
    };
    assert_eq!(extra_mounts(&c), []);
    let s = json_of(&c);
    assert_eq!(strings(&s["linux"]["maskedPaths"]), ["/bin/ls"]);
    assert_eq!(strings(&s["linux"]["readonlyPaths"]), ["/tmp"]);
}

#[test]
fn the_oom_score_is_never_set_below_the_current_process() {
    let mut c = base();
    c.resources.oom_score_adj = -998;
    let floor_zero = host();
    let spec = container_spec_on(&c, &floor_zero).unwrap();
    assert_eq!(spec.process().as_ref().unwrap().oom_score_adj(), Some(0));
    let unrestricted = HostInfo { min_oom_score_adj: -1000, ..host() };
    assert_eq!(container_spec_on(&c, &unrestricted).unwrap().process().as_ref().unwrap().oom_score_adj(), Some(-998));
    c.resources.oom_score_adj = 5000;
    assert_eq!(container_spec_on(&c, &floor_zero).unwrap().process().as_ref().unwrap().oom_score_adj(), Some(1000));
}

#[test]
fn cri_mounts_map_propagation_and_flags_and_replace_defaults_at_the_same_path() {
    let mut c = base();
    c.readonly_rootfs = true;
    c.sandbox_files = SandboxFiles {
        hosts: Some("/run/berth/pod1/hosts".into()),
        resolv_conf: Some("/run/berth/pod1/resolv.conf".into()),
        hostname: Some("/run/berth/pod1/hostname".into()),
        shm: Some("/run/berth/pod1/shm".into()),
    };
    c.mounts = vec![
        Mount {
            container_path: "/data/cache".into(),
            host_path: "/srv/cache".into(),
            propagation: Propagation::HostToContainer,
            ..Default::default()
        },
        Mount {
            container_path: "/data".into(),
            host_path: "/srv/data".into(),
            readonly: true,
            propagation: Propagation::Bidirectional,
            options: vec!["nosuid".into()],
        },
        Mount { container_path: "/etc/hosts".into(), host_path: "/tmp/my-hosts".into(), ..Default::default() },
    ];
    let s = json_of(&c);
    assert_eq!(s["root"]["readonly"], true);
    assert_eq!(
        mount(&s, "/data").unwrap(),
        &json!({"destination": "/data", "type": "bind", "source": "/srv/data", "options": ["rbind", "rshared", "ro", "nosuid"]})
    );
    assert_eq!(strings(&mount(&s, "/data/cache").unwrap()["options"]), ["rbind", "rslave", "rw"]);
    let dests: Vec<_> = s["mounts"].as_array().unwrap().iter().map(|m| m["destination"].as_str().unwrap()).collect();
    let (parent, child) =
        (dests.iter().position(|d| *d == "/data").unwrap(), dests.iter().position(|d| *d == "/data/cache").unwrap());
    assert!(parent < child, "parents are mounted first: {dests:?}");
    assert_eq!(dests.iter().filter(|d| **d == "/etc/hosts").count(), 1);
    assert_eq!(mount(&s, "/etc/hosts").unwrap()["source"], "/tmp/my-hosts");
    assert_eq!(strings(&mount(&s, "/etc/resolv.conf").unwrap()["options"]), ["rbind", "rprivate", "ro"]);
    assert_eq!(mount(&s, "/dev/shm").unwrap()["source"], "/run/berth/pod1/shm");
    assert_eq!(s["linux"]["rootfsPropagation"], "rshared");

    c.mounts = vec![Mount { container_path: "data".into(), host_path: "/srv".into(), ..Default::default() }];
    assert!(matches!(container_spec_on(&c, &host()), Err(SpecError::InvalidMount { .. })));
}

#[test]
fn namespaces_can_be_new_the_hosts_or_joined_by_path() {
    let mut c = base();
    c.namespaces = Namespaces {
        pid: NamespaceMode::Host,
        network: NamespaceMode::Path("/var/run/netns/pod1".into()),
        ipc: NamespaceMode::Path("/proc/42/ns/ipc".into()),
        uts: NamespaceMode::Host,
        ..Default::default()
    };
    let s = json_of(&c);
    assert_eq!(
        s["linux"]["namespaces"],
        json!([
            {"type": "ipc", "path": "/proc/42/ns/ipc"},
            {"type": "mount"},
            {"type": "network", "path": "/var/run/netns/pod1"},
            {"type": "cgroup"}
        ])
    );
    assert!(s.get("hostname").is_none(), "no hostname without a private UTS namespace");
    c.namespaces.mount = NamespaceMode::Host;
    assert!(matches!(container_spec_on(&c, &host()), Err(SpecError::InvalidNamespace { namespace: "mount", .. })));
}

#[test]
fn cri_resources_become_linux_resources_and_zero_means_unset() {
    let mut c = base();
    c.cgroup_parent = Some("/kubepods/burstable/podabc".into());
    c.resources = Resources {
        cpu_period: 100_000,
        cpu_quota: 50_000,
        cpu_shares: 512,
        memory_limit_in_bytes: 64 << 20,
        cpuset_cpus: "0-1".into(),
        hugepage_limits: vec![("2MB".into(), 0)],
        unified: [("memory.high".to_owned(), "max".to_owned())].into(),
        ..Default::default()
    };
    let s = json_of(&c);
    let r = &s["linux"]["resources"];
    assert_eq!(r["cpu"], json!({"shares": 512, "quota": 50000, "period": 100000, "cpus": "0-1"}));
    assert_eq!(r["memory"], json!({"limit": 67108864}));
    assert_eq!(r["hugepageLimits"], json!([{"pageSize": "2MB", "limit": 0}]));
    assert_eq!(r["unified"], json!({"memory.high": "max"}));
    assert_eq!(s["linux"]["cgroupsPath"], "/kubepods/burstable/podabc/c1");
    let none = serde_json::to_value(linux_resources(&Resources::default()).unwrap()).unwrap();
    assert_eq!(none, json!({}));
}

#[test]
fn cri_devices_become_nodes_with_allow_rules() {
    let mut c = base();
    c.devices =
        vec![Device { container_path: "/dev/mynull".into(), host_path: "/dev/null".into(), permissions: "rw".into() }];
    let s = json_of(&c);
    let dev = &s["linux"]["devices"][0];
    assert_eq!(
        (dev["path"].as_str(), dev["type"].as_str(), &dev["major"], &dev["minor"]),
        (Some("/dev/mynull"), Some("c"), &json!(1), &json!(3))
    );
    assert_eq!(
        s["linux"]["resources"]["devices"],
        json!([{"allow": false, "access": "rwm"}, {"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rw"}])
    );
    c.devices[0].host_path = "/etc/hostname".into();
    assert!(matches!(container_spec_on(&c, &host()), Err(SpecError::Device { .. })));
    c.devices[0] = Device { container_path: "/dev/x".into(), host_path: "/dev/null".into(), permissions: "rwx".into() };
    assert!(matches!(container_spec_on(&c, &host()), Err(SpecError::Device { .. })));
}

#[test]
fn a_privileged_container_gets_every_held_capability_and_device_and_no_confinement() {
    let mut c = base();
    c.privileged = true;
    c.seccomp = SeccompProfile::RuntimeDefault;
    let mut null = LinuxDevice::default();
    null.set_path("/dev/null".into()).set_typ(LinuxDeviceType::C).set_major(1).set_minor(3);
    let h = HostInfo { devices: vec![null], ..host() };
    let s = serde_json::to_value(container_spec_on(&c, &h).unwrap()).unwrap();
    let caps = strings(&s["process"]["capabilities"]["bounding"]);
    assert_eq!(caps.len(), 40);
    assert!(caps.contains(&"CAP_SYS_ADMIN".into()) && !caps.contains(&"CAP_SYS_RESOURCE".into()));
    assert_eq!(s["linux"]["maskedPaths"], json!([]));
    assert_eq!(s["linux"]["readonlyPaths"], json!([]));
    assert!(s["linux"].get("seccomp").is_none());
    assert_eq!(s["linux"]["devices"][0]["path"], "/dev/null");
    assert_eq!(s["linux"]["resources"]["devices"], json!([{"allow": true, "access": "rwm"}]));
    assert!(strings(&mount(&s, "/sys").unwrap()["options"]).contains(&"rw".to_owned()));
}

#[test]
fn runtime_default_seccomp_is_generated_for_the_containers_capabilities() {
    let mut c = base();
    c.seccomp = SeccompProfile::RuntimeDefault;
    let s = json_of(&c);
    assert_eq!(s["linux"]["seccomp"]["defaultAction"], "SCMP_ACT_ALLOW");
    let denied: Vec<String> = s["linux"]["seccomp"]["syscalls"][0]["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_owned())
        .collect();
    assert!(denied.contains(&"mount".to_owned()));
    c.add_capabilities = vec!["SYS_ADMIN".into()];
    let s = json_of(&c);
    assert!(!s["linux"]["seccomp"]["syscalls"][0]["names"].as_array().unwrap().contains(&json!("mount")));
}

#[test]
fn masked_and_readonly_paths_given_by_cri_replace_the_defaults() {
    let mut c = base();
    c.masked_paths = Some(vec![]);
    c.readonly_paths = Some(vec!["/proc/sys".into()]);
    let s = json_of(&c);
    assert_eq!(s["linux"]["maskedPaths"], json!([]));
    assert_eq!(s["linux"]["readonlyPaths"], json!(["/proc/sys"]));
}

#[test]
fn annotations_sysctls_tty_and_no_new_privileges_pass_through() {
    let mut c = base();
    c.annotations = [("io.kubernetes.cri.container-name".to_owned(), "web".to_owned())].into();
    c.sysctls = [("net.ipv4.ip_forward".to_owned(), "1".to_owned())].into();
    c.tty = true;
    c.no_new_privileges = true;
    let s = json_of(&c);
    assert_eq!(s["annotations"], json!({"io.kubernetes.cri.container-name": "web"}));
    assert_eq!(s["linux"]["sysctl"], json!({"net.ipv4.ip_forward": "1"}));
    assert_eq!((&s["process"]["terminal"], &s["process"]["noNewPrivileges"]), (&json!(true), &json!(true)));
}

#[test]
fn host_info_is_read_from_the_current_process() {
    let h = HostInfo::detect(false).unwrap();
    assert!(h.nofile_limit > 0);
    assert!(h.bounding_caps & 1 != 0 || h.bounding_caps == 0);
    assert!((-1000..=1000).contains(&h.min_oom_score_adj));
    assert!(h.devices.is_empty());
}

#[test]
fn host_devices_include_dev_null_and_skip_the_runtimes_own() {
    let devices = host_devices().unwrap();
    assert!(devices.iter().any(|d| d.path() == Path::new("/dev/null") && d.major() == 1 && d.minor() == 3));
    assert!(!devices.iter().any(|d| d.path().starts_with("/dev/pts") || d.path() == Path::new("/dev/ptmx")));
}
