//! Generation of a container's OCI runtime spec (`config.json`) from berth's [`ContainerSpec`],
//! which the CRI layer fills from the CRI `ContainerConfig`, the `PodSandboxConfig` and the image
//! config.
//!
//! The defaults follow what containerd's CRI plugin gives a Kubernetes container: Docker's default
//! capability set, the standard `/proc` `/dev` `/sys` mounts with `/sys/fs/cgroup` read-only,
//! Kubernetes' masked and read-only `/proc` paths, a deny-all device cgroup plus the CRI devices,
//! and `runtime/default` seccomp only when asked for. Two host facts are applied so that the
//! runtime does not fail on this kind of VM: the OOM score is never set below the current
//! process's (lowering needs CAP_SYS_RESOURCE) and "all capabilities" means all in our bounding set.
//! What the OCI runtime does not do is worked around too ([`RuntimeGaps`]): capabilities it
//! cannot grant are left out, and masked and read-only paths it ignores become mounts.

mod seccomp;
mod user;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};

use oci_spec::OciSpecError;
use oci_spec::runtime::{
    Capabilities, Capability, LinuxBuilder, LinuxCapabilities, LinuxCpu, LinuxDevice, LinuxDeviceCgroup,
    LinuxDeviceType, LinuxHugepageLimitBuilder, LinuxMemory, LinuxNamespace, LinuxNamespaceType, LinuxResources,
    LinuxSeccomp, Mount as OciMount, PosixRlimitBuilder, PosixRlimitType, ProcessBuilder, RootBuilder, Spec,
    SpecBuilder, UserBuilder,
};

pub use seccomp::default_profile as default_seccomp_profile;
pub use user::{ResolvedUser, UserConfig, UserError, resolve, resolve_user};

/// A failure to generate a container's spec. `NoCommand`, `InvalidCapability`, `InvalidMount`,
/// `InvalidNamespace`, `RelativeWorkingDir`, `User` and `Device` come from bad input; `Host` and
/// `Build` are internal.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("no command: the image has no entrypoint or cmd and the container gives none")]
    NoCommand,
    #[error("unknown capability {name:?}")]
    InvalidCapability { name: String },
    #[error("invalid mount at {container_path:?}: {reason}")]
    InvalidMount { container_path: String, reason: &'static str },
    #[error("invalid {namespace} namespace: {reason}")]
    InvalidNamespace { namespace: &'static str, reason: &'static str },
    #[error("working directory {path:?} is not absolute")]
    RelativeWorkingDir { path: String },
    #[error("could not resolve the container's user")]
    User(#[source] UserError),
    #[error("invalid device {host_path}: {reason}")]
    Device { host_path: PathBuf, reason: String },
    #[error("could not read {what} of the host")]
    Host {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("could not assemble the spec")]
    Build(#[source] OciSpecError),
}

/// The parts of an image's config that shape the container's process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageConfig {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `KEY=value` entries.
    pub env: Vec<String>,
    pub working_dir: String,
    pub user: String,
}

/// How a namespace is set up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NamespaceMode {
    /// A namespace of its own.
    #[default]
    New,
    /// The host's (the namespace is left out of the spec).
    Host,
    /// Join an existing one: a pod's netns under `/var/run/netns`, or `/proc/PID/ns/…` of another
    /// container.
    Path(PathBuf),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespaces {
    pub pid: NamespaceMode,
    pub ipc: NamespaceMode,
    pub uts: NamespaceMode,
    /// `Host` is refused: a container always gets its own mount table.
    pub mount: NamespaceMode,
    pub network: NamespaceMode,
    pub cgroup: NamespaceMode,
}

/// CRI mount propagation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Propagation {
    /// `PROPAGATION_PRIVATE` → `rprivate`.
    #[default]
    Private,
    /// `PROPAGATION_HOST_TO_CONTAINER` → `rslave`.
    HostToContainer,
    /// `PROPAGATION_BIDIRECTIONAL` → `rshared`.
    Bidirectional,
}

/// A CRI bind mount.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mount {
    pub container_path: String,
    pub host_path: PathBuf,
    pub readonly: bool,
    pub propagation: Propagation,
    /// Further mount options (`nosuid`, `noexec`, …), appended as given.
    pub options: Vec<String>,
}

/// A CRI device: a host device node, or a directory of them, made available at `container_path`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Device {
    pub container_path: String,
    pub host_path: PathBuf,
    /// Cgroup access: any of `r`, `w`, `m`; empty means `rwm`.
    pub permissions: String,
}

/// Files the sandbox prepared for all of its containers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxFiles {
    pub hosts: Option<PathBuf>,
    pub resolv_conf: Option<PathBuf>,
    pub hostname: Option<PathBuf>,
    /// The pod's `/dev/shm` (a tmpfs the sandbox mounted), shared when the pod shares IPC.
    pub shm: Option<PathBuf>,
}

/// CRI `LinuxContainerResources`; zero or empty means unset, as on the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpu_period: i64,
    pub cpu_quota: i64,
    pub cpu_shares: i64,
    pub memory_limit_in_bytes: i64,
    pub memory_swap_limit_in_bytes: i64,
    pub oom_score_adj: i64,
    pub cpuset_cpus: String,
    pub cpuset_mems: String,
    /// `(page_size, limit in bytes)`, e.g. `("2MB", 0)`.
    pub hugepage_limits: Vec<(String, u64)>,
    pub unified: BTreeMap<String, String>,
}

/// The seccomp profile a container asks for (CRI `SecurityProfile`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SeccompProfile {
    /// No filter: CRI's meaning of an unset profile.
    #[default]
    Unconfined,
    /// berth's default profile, see [`default_seccomp_profile`].
    RuntimeDefault,
    /// A profile already in OCI form (e.g. a `Localhost` profile loaded by the caller).
    Custom(LinuxSeccomp),
}

/// Everything a container's spec is generated from. The CRI layer fills it; `Default` gives an
/// unprivileged container with new namespaces and no command.
#[derive(Debug, Clone, Default)]
pub struct ContainerSpec {
    pub id: String,
    pub pod_id: String,
    /// The container's root filesystem (absolute).
    pub rootfs: PathBuf,
    pub readonly_rootfs: bool,
    pub image: ImageConfig,
    /// CRI `command` and `args`, merged with the image's by [`merge_command`].
    pub command: Vec<String>,
    pub args: Vec<String>,
    /// CRI `envs`, laid over the image's.
    pub env: Vec<(String, String)>,
    pub working_dir: Option<String>,
    pub tty: bool,
    /// Set only when the UTS namespace is not the host's.
    pub hostname: Option<String>,
    pub user: UserConfig,
    pub privileged: bool,
    pub no_new_privileges: bool,
    pub add_capabilities: Vec<String>,
    pub drop_capabilities: Vec<String>,
    pub seccomp: SeccompProfile,
    /// `None`: Kubernetes' default list; `Some`: exactly these (CRI `masked_paths`).
    pub masked_paths: Option<Vec<String>>,
    /// `None`: Kubernetes' default list; `Some`: exactly these (CRI `readonly_paths`).
    pub readonly_paths: Option<Vec<String>>,
    pub mounts: Vec<Mount>,
    pub sandbox_files: SandboxFiles,
    pub namespaces: Namespaces,
    pub resources: Resources,
    /// Cgroupfs parent, e.g. the pod's `/kubepods/besteffort/pod<uid>`; default `/berth/<pod_id>`.
    pub cgroup_parent: Option<String>,
    pub sysctls: BTreeMap<String, String>,
    pub devices: Vec<Device>,
    /// Passed through as the spec's annotations (the CRI layer filters them).
    pub annotations: BTreeMap<String, String>,
    /// What the OCI runtime that runs the spec does not do.
    pub runtime_gaps: RuntimeGaps,
}

/// What an OCI runtime does not do that the generated spec works around; `Default` is a runtime
/// without gaps (runc, crun).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeGaps {
    /// Capabilities the runtime refuses to start a container with (gVisor's runsc of 2022 knows
    /// none after `CAP_AUDIT_READ`): left out of every capability set, whether they come from
    /// privileged, from `ALL` or by name.
    pub unsupported_capabilities: Vec<Capability>,
    /// The runtime ignores `linux.maskedPaths` and `linux.readonlyPaths` (runsc): the paths in the
    /// rootfs are masked and made read-only by mounts instead (see [`path_mounts`]).
    pub ignores_masked_and_readonly_paths: bool,
}

/// Facts about the host that bound what a container may be given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostInfo {
    /// The current process's `oom_score_adj`: a container's is never set lower.
    pub min_oom_score_adj: i32,
    /// The current process's hard `RLIMIT_NOFILE`: the container's default NOFILE.
    pub nofile_limit: u64,
    /// The current process's capability bounding set (bit N = capability N).
    pub bounding_caps: u64,
    /// Every device node under `/dev`, for privileged containers; empty otherwise.
    pub devices: Vec<LinuxDevice>,
}

impl HostInfo {
    /// Reads the host facts from `/proc/self` (and `/dev` when `with_devices`).
    pub fn detect(with_devices: bool) -> Result<HostInfo, SpecError> {
        let host = |what| move |source| SpecError::Host { what, source };
        let oom = std::fs::read_to_string("/proc/self/oom_score_adj").map_err(host("/proc/self/oom_score_adj"))?;
        let status = std::fs::read_to_string("/proc/self/status").map_err(host("/proc/self/status"))?;
        let bounding_caps = status
            .lines()
            .find_map(|l| l.strip_prefix("CapBnd:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0);
        let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map_err(|e| SpecError::Host { what: "RLIMIT_NOFILE", source: e.into() })?;
        let devices = if with_devices { host_devices().map_err(host("/dev"))? } else { Vec::new() };
        Ok(HostInfo {
            min_oom_score_adj: oom.trim().parse().unwrap_or(0),
            nofile_limit: hard.min(1 << 20),
            bounding_caps,
            devices,
        })
    }
}

/// Generates the spec, reading the host facts it depends on (see [`HostInfo`]).
pub fn container_spec(c: &ContainerSpec) -> Result<Spec, SpecError> {
    container_spec_on(c, &HostInfo::detect(c.privileged)?)
}

/// Generates the spec for a host described by `host`.
pub fn container_spec_on(c: &ContainerSpec, host: &HostInfo) -> Result<Spec, SpecError> {
    let args = merge_command(&c.image.entrypoint, &c.image.cmd, &c.command, &c.args);
    if args.is_empty() {
        return Err(SpecError::NoCommand);
    }
    let uts_private = c.namespaces.uts != NamespaceMode::Host;
    let hostname = c.hostname.as_deref().filter(|_| uts_private);
    let cwd = c
        .working_dir
        .as_deref()
        .filter(|d| !d.is_empty())
        .or(Some(c.image.working_dir.as_str()).filter(|d| !d.is_empty()))
        .unwrap_or("/");
    if !cwd.starts_with('/') {
        return Err(SpecError::RelativeWorkingDir { path: cwd.to_owned() });
    }
    let who = user::resolve(&c.rootfs, &c.user, &c.image.user).map_err(SpecError::User)?;
    let caps = capabilities(c, host.bounding_caps)?;

    let oci_user = UserBuilder::default()
        .uid(who.uid)
        .gid(who.gid)
        .additional_gids(who.additional_gids.clone())
        .build()
        .map_err(SpecError::Build)?;
    // Built on the struct, not its builder: the builder would fill inheritable and ambient from
    // oci-spec's defaults. Neither is set, as in containerd since CVE-2022-24769.
    let mut oci_caps = LinuxCapabilities::default();
    oci_caps
        .set_bounding(Some(caps.clone()))
        .set_effective(Some(caps.clone()))
        .set_permitted(Some(caps.clone()))
        .set_inheritable(None)
        .set_ambient(None);
    let nofile = PosixRlimitBuilder::default()
        .typ(PosixRlimitType::RlimitNofile)
        .hard(host.nofile_limit)
        .soft(host.nofile_limit)
        .build()
        .map_err(SpecError::Build)?;
    let oom_score_adj = clamp_oom_score_adj(c.resources.oom_score_adj, host.min_oom_score_adj);
    let process = ProcessBuilder::default()
        .terminal(c.tty)
        .user(oci_user)
        .args(args)
        .env(merge_env(&c.image.env, &c.env, hostname))
        .cwd(cwd)
        .capabilities(oci_caps)
        .rlimits(vec![nofile])
        .no_new_privileges(c.no_new_privileges)
        .oom_score_adj(oom_score_adj)
        .build()
        .map_err(SpecError::Build)?;

    let (devices, device_rules) = devices(c, host)?;
    let mut resources = linux_resources(&c.resources).map_err(SpecError::Build)?;
    resources.set_devices(Some(device_rules));

    let (masked, readonly) = if c.privileged {
        (Vec::new(), Vec::new())
    } else {
        (
            c.masked_paths.clone().unwrap_or_else(|| DEFAULT_MASKED_PATHS.iter().map(|s| s.to_string()).collect()),
            c.readonly_paths.clone().unwrap_or_else(|| DEFAULT_READONLY_PATHS.iter().map(|s| s.to_string()).collect()),
        )
    };
    let seccomp = match (&c.seccomp, c.privileged) {
        (_, true) | (SeccompProfile::Unconfined, _) => None,
        (SeccompProfile::RuntimeDefault, false) => Some(seccomp::default_profile(&caps)),
        (SeccompProfile::Custom(profile), false) => Some(profile.clone()),
    };
    let mut mounts = mounts(c)?;
    if c.runtime_gaps.ignores_masked_and_readonly_paths {
        let extra = path_mounts(&c.rootfs, &masked, &readonly, &mounts);
        mounts.extend(extra);
    }
    let mut linux = LinuxBuilder::default()
        .namespaces(namespaces(&c.namespaces)?)
        .resources(resources)
        .cgroups_path(cgroups_path(c))
        .devices(devices)
        .masked_paths(masked)
        .readonly_paths(readonly)
        .sysctl(c.sysctls.clone().into_iter().collect::<HashMap<_, _>>())
        .build()
        .map_err(SpecError::Build)?;
    linux.set_seccomp(seccomp);
    if let Some(p) = rootfs_propagation(&c.mounts) {
        linux.set_rootfs_propagation(Some(p.to_owned()));
    }

    let root = RootBuilder::default().path(&c.rootfs).readonly(c.readonly_rootfs).build().map_err(SpecError::Build)?;
    let mut spec = SpecBuilder::default()
        .version("1.0.2-dev")
        .root(root)
        .process(process)
        .mounts(mounts)
        .linux(linux)
        .annotations(c.annotations.clone().into_iter().collect::<HashMap<_, _>>())
        .build()
        .map_err(SpecError::Build)?;
    spec.set_hostname(hostname.map(str::to_owned));
    Ok(spec)
}

/// The container's argv by Kubernetes' rules: the CRI command replaces the image's entrypoint
/// (and then the image's cmd is dropped), the CRI args replace the image's cmd.
pub fn merge_command(
    image_entrypoint: &[String],
    image_cmd: &[String],
    cri_command: &[String],
    cri_args: &[String],
) -> Vec<String> {
    match (cri_command.is_empty(), cri_args.is_empty()) {
        (true, true) => [image_entrypoint, image_cmd].concat(),
        (true, false) => [image_entrypoint, cri_args].concat(),
        (false, true) => cri_command.to_vec(),
        (false, false) => [cri_command, cri_args].concat(),
    }
}

/// The container's environment: a default `PATH` and `HOSTNAME`, then the image's entries, then
/// the CRI ones; a later entry for a key replaces the earlier one in its place.
pub fn merge_env(image_env: &[String], cri_env: &[(String, String)], hostname: Option<&str>) -> Vec<String> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut set = |key: &str, value: &str| match out.iter_mut().find(|(k, _)| k == key) {
        Some(entry) => entry.1 = value.to_owned(),
        None => out.push((key.to_owned(), value.to_owned())),
    };
    set("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    if let Some(h) = hostname {
        set("HOSTNAME", h);
    }
    for entry in image_env {
        let (k, v) = entry.split_once('=').unwrap_or((entry, ""));
        set(k, v);
    }
    for (k, v) in cri_env {
        set(k, v);
    }
    out.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// Containerd's and Docker's default capability set for containers.
pub const DEFAULT_CAPABILITIES: &[Capability] = &[
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fsetid,
    Capability::Fowner,
    Capability::Mknod,
    Capability::NetRaw,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setfcap,
    Capability::Setpcap,
    Capability::NetBindService,
    Capability::SysChroot,
    Capability::Kill,
    Capability::AuditWrite,
];

/// Every capability with its number in the kernel's bit sets.
const ALL_CAPABILITIES: &[(Capability, u32)] = &[
    (Capability::Chown, 0),
    (Capability::DacOverride, 1),
    (Capability::DacReadSearch, 2),
    (Capability::Fowner, 3),
    (Capability::Fsetid, 4),
    (Capability::Kill, 5),
    (Capability::Setgid, 6),
    (Capability::Setuid, 7),
    (Capability::Setpcap, 8),
    (Capability::LinuxImmutable, 9),
    (Capability::NetBindService, 10),
    (Capability::NetBroadcast, 11),
    (Capability::NetAdmin, 12),
    (Capability::NetRaw, 13),
    (Capability::IpcLock, 14),
    (Capability::IpcOwner, 15),
    (Capability::SysModule, 16),
    (Capability::SysRawio, 17),
    (Capability::SysChroot, 18),
    (Capability::SysPtrace, 19),
    (Capability::SysPacct, 20),
    (Capability::SysAdmin, 21),
    (Capability::SysBoot, 22),
    (Capability::SysNice, 23),
    (Capability::SysResource, 24),
    (Capability::SysTime, 25),
    (Capability::SysTtyConfig, 26),
    (Capability::Mknod, 27),
    (Capability::Lease, 28),
    (Capability::AuditWrite, 29),
    (Capability::AuditControl, 30),
    (Capability::Setfcap, 31),
    (Capability::MacOverride, 32),
    (Capability::MacAdmin, 33),
    (Capability::Syslog, 34),
    (Capability::WakeAlarm, 35),
    (Capability::BlockSuspend, 36),
    (Capability::AuditRead, 37),
    (Capability::Perfmon, 38),
    (Capability::Bpf, 39),
    (Capability::CheckpointRestore, 40),
];

/// Kubernetes' default masked paths (what the kubelet sends and containerd applies).
pub const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// Kubernetes' default read-only paths.
pub const DEFAULT_READONLY_PATHS: &[&str] = &["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];

/// The container's capabilities: privileged → every capability we hold; otherwise the default
/// set, then `ALL` in add (every capability we hold) or in drop (none), then the single adds, then
/// the single drops (a drop beats an add). Those the runtime does not support are left out last.
fn capabilities(c: &ContainerSpec, bounding: u64) -> Result<Capabilities, SpecError> {
    let mut caps = requested_capabilities(c, bounding)?;
    caps.retain(|cap| !c.runtime_gaps.unsupported_capabilities.contains(cap));
    Ok(caps)
}

fn requested_capabilities(c: &ContainerSpec, bounding: u64) -> Result<Capabilities, SpecError> {
    let held = || ALL_CAPABILITIES.iter().filter(|(_, bit)| bounding & (1 << bit) != 0).map(|(cap, _)| *cap);
    if c.privileged {
        return Ok(held().collect());
    }
    let is_all = |s: &String| s.eq_ignore_ascii_case("ALL");
    let mut caps: Capabilities = DEFAULT_CAPABILITIES.iter().copied().collect();
    if c.add_capabilities.iter().any(is_all) {
        caps = held().collect();
    }
    if c.drop_capabilities.iter().any(is_all) {
        caps.clear();
    }
    for name in c.add_capabilities.iter().filter(|s| !is_all(s)) {
        caps.insert(parse_capability(name)?);
    }
    for name in c.drop_capabilities.iter().filter(|s| !is_all(s)) {
        caps.remove(&parse_capability(name)?);
    }
    Ok(caps)
}

/// `NET_ADMIN`, `CAP_NET_ADMIN` and `net_admin` are all `CAP_NET_ADMIN`.
pub fn parse_capability(name: &str) -> Result<Capability, SpecError> {
    let upper = name.to_ascii_uppercase();
    upper
        .strip_prefix("CAP_")
        .unwrap_or(&upper)
        .parse()
        .map_err(|_| SpecError::InvalidCapability { name: name.to_owned() })
}

/// Never below the current process's score: lowering needs CAP_SYS_RESOURCE, which this host's
/// root lacks (containerd's `restrict_oom_score_adj`). Also kept within the kernel's range.
fn clamp_oom_score_adj(requested: i64, floor: i32) -> i32 {
    requested.clamp(-1000, 1000).max(i64::from(floor)) as i32
}

/// The OCI `linux.resources` for CRI resources (also what `update` takes).
pub fn linux_resources(r: &Resources) -> Result<LinuxResources, OciSpecError> {
    let mut res = LinuxResources::default();
    let mut cpu = LinuxCpu::default();
    let mut cpu_set = false;
    if r.cpu_shares > 0 {
        cpu.set_shares(Some(r.cpu_shares as u64));
        cpu_set = true;
    }
    if r.cpu_quota != 0 {
        cpu.set_quota(Some(r.cpu_quota));
        cpu_set = true;
    }
    if r.cpu_period > 0 {
        cpu.set_period(Some(r.cpu_period as u64));
        cpu_set = true;
    }
    if !r.cpuset_cpus.is_empty() {
        cpu.set_cpus(Some(r.cpuset_cpus.clone()));
        cpu_set = true;
    }
    if !r.cpuset_mems.is_empty() {
        cpu.set_mems(Some(r.cpuset_mems.clone()));
        cpu_set = true;
    }
    if cpu_set {
        res.set_cpu(Some(cpu));
    }
    if r.memory_limit_in_bytes > 0 || r.memory_swap_limit_in_bytes > 0 {
        let mut mem = LinuxMemory::default();
        if r.memory_limit_in_bytes > 0 {
            mem.set_limit(Some(r.memory_limit_in_bytes));
        }
        if r.memory_swap_limit_in_bytes > 0 {
            mem.set_swap(Some(r.memory_swap_limit_in_bytes));
        }
        res.set_memory(Some(mem));
    }
    if !r.hugepage_limits.is_empty() {
        let limits = r
            .hugepage_limits
            .iter()
            .map(|(size, limit)| {
                LinuxHugepageLimitBuilder::default().page_size(size.clone()).limit(*limit as i64).build()
            })
            .collect::<Result<Vec<_>, _>>()?;
        res.set_hugepage_limits(Some(limits));
    }
    if !r.unified.is_empty() {
        res.set_unified(Some(r.unified.clone().into_iter().collect()));
    }
    Ok(res)
}

fn cgroups_path(c: &ContainerSpec) -> PathBuf {
    let parent = match &c.cgroup_parent {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ if c.pod_id.is_empty() => PathBuf::from("/berth"),
        _ => Path::new("/berth").join(&c.pod_id),
    };
    parent.join(&c.id)
}

fn namespaces(n: &Namespaces) -> Result<Vec<LinuxNamespace>, SpecError> {
    if n.mount == NamespaceMode::Host {
        return Err(SpecError::InvalidNamespace { namespace: "mount", reason: "a container cannot use the host's" });
    }
    let all = [
        (LinuxNamespaceType::Pid, "pid", &n.pid),
        (LinuxNamespaceType::Ipc, "ipc", &n.ipc),
        (LinuxNamespaceType::Uts, "uts", &n.uts),
        (LinuxNamespaceType::Mount, "mount", &n.mount),
        (LinuxNamespaceType::Network, "network", &n.network),
        (LinuxNamespaceType::Cgroup, "cgroup", &n.cgroup),
    ];
    let mut out = Vec::new();
    for (typ, name, mode) in all {
        let mut ns = LinuxNamespace::default();
        ns.set_typ(typ);
        match mode {
            NamespaceMode::Host => continue,
            NamespaceMode::New => {}
            NamespaceMode::Path(p) if p.is_absolute() => {
                ns.set_path(Some(p.clone()));
            }
            NamespaceMode::Path(_) => {
                return Err(SpecError::InvalidNamespace { namespace: name, reason: "the path is not absolute" });
            }
        }
        out.push(ns);
    }
    Ok(out)
}

fn oci_mount(destination: &str, typ: &str, source: &Path, options: &[&str]) -> OciMount {
    let mut m = OciMount::default();
    m.set_destination(PathBuf::from(destination))
        .set_typ(Some(typ.to_owned()))
        .set_source(Some(source.to_path_buf()))
        .set_options(Some(options.iter().map(|s| s.to_string()).collect()));
    m
}

/// The standard mounts, the sandbox's files, then the CRI mounts (parents before children); a CRI
/// mount replaces a standard or sandbox mount at the same destination.
fn mounts(c: &ContainerSpec) -> Result<Vec<OciMount>, SpecError> {
    let rw = if c.privileged { "rw" } else { "ro" };
    let mut out = vec![
        oci_mount("/proc", "proc", Path::new("proc"), &["nosuid", "noexec", "nodev"]),
        oci_mount("/dev", "tmpfs", Path::new("tmpfs"), &["nosuid", "strictatime", "mode=755", "size=65536k"]),
        oci_mount(
            "/dev/pts",
            "devpts",
            Path::new("devpts"),
            &["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
        ),
        oci_mount("/dev/mqueue", "mqueue", Path::new("mqueue"), &["nosuid", "noexec", "nodev"]),
        oci_mount("/sys", "sysfs", Path::new("sysfs"), &["nosuid", "noexec", "nodev", rw]),
        oci_mount("/sys/fs/cgroup", "cgroup", Path::new("cgroup"), &["nosuid", "noexec", "nodev", "relatime", rw]),
    ];
    match &c.sandbox_files.shm {
        Some(shm) => {
            out.push(oci_mount("/dev/shm", "bind", shm, &["rbind", "rprivate", "nosuid", "nodev", "noexec", "rw"]))
        }
        None => out.push(oci_mount(
            "/dev/shm",
            "tmpfs",
            Path::new("shm"),
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        )),
    }
    // The sandbox's files are read-only when the rootfs is, as containerd does.
    let file_mode = if c.readonly_rootfs { "ro" } else { "rw" };
    for (dest, src) in [
        ("/etc/hosts", &c.sandbox_files.hosts),
        ("/etc/resolv.conf", &c.sandbox_files.resolv_conf),
        ("/etc/hostname", &c.sandbox_files.hostname),
    ] {
        if let Some(src) = src {
            out.push(oci_mount(dest, "bind", src, &["rbind", "rprivate", file_mode]));
        }
    }

    let mut cri: Vec<&Mount> = c.mounts.iter().collect();
    for m in &cri {
        if !m.container_path.starts_with('/') {
            return Err(SpecError::InvalidMount { container_path: m.container_path.clone(), reason: "not absolute" });
        }
        if !m.host_path.is_absolute() {
            return Err(SpecError::InvalidMount {
                container_path: m.container_path.clone(),
                reason: "host path not absolute",
            });
        }
    }
    cri.sort_by_key(|m| Path::new(&m.container_path).components().count());
    out.retain(|d| !cri.iter().any(|m| Path::new(&m.container_path) == d.destination()));
    for m in cri {
        let propagation = match m.propagation {
            Propagation::Private => "rprivate",
            Propagation::HostToContainer => "rslave",
            Propagation::Bidirectional => "rshared",
        };
        let mut options = vec!["rbind", propagation, if m.readonly { "ro" } else { "rw" }];
        options.extend(m.options.iter().map(String::as_str));
        out.push(oci_mount(&m.container_path, "bind", &m.host_path, &options));
    }
    Ok(out)
}

/// Mounts that mask and make read-only the paths of `masked` and `readonly`, for a runtime that
/// ignores `linux.maskedPaths` and `linux.readonlyPaths`; as runc applies them: a masked file gets
/// `/dev/null` bound over it, a masked directory an empty read-only tmpfs, and a read-only path is
/// bound onto itself read-only. They come after `mounts`.
///
/// Only paths that exist in the rootfs, are reached there without a symlink or `..`, and neither
/// lie in nor hold another mount are covered: a bind mount's source is resolved on the host, so a
/// symlink in the image could point it anywhere; a path under `/proc`, `/sys`, `/dev` or a volume
/// is not in the rootfs (gVisor's own `/proc` and `/sys` hold none of the host's files the default
/// masks hide); and a mount over `/etc` would hide the sandbox's `/etc/hosts` under it. As with
/// runc, a path that does not exist is not an error.
pub fn path_mounts(rootfs: &Path, masked: &[String], readonly: &[String], mounts: &[OciMount]) -> Vec<OciMount> {
    let in_rootfs = |path: &str| -> Option<(PathBuf, std::fs::Metadata)> {
        let inside = Path::new(path);
        let overlaps = |m: &OciMount| inside.starts_with(m.destination()) || m.destination().starts_with(inside);
        if !inside.is_absolute() || mounts.iter().any(overlaps) {
            return None;
        }
        let mut host = rootfs.to_path_buf();
        let mut meta = None;
        for part in inside.components().skip(1) {
            let std::path::Component::Normal(name) = part else { return None };
            host.push(name);
            let m = std::fs::symlink_metadata(&host).ok()?;
            if m.file_type().is_symlink() {
                return None;
            }
            meta = Some(m);
        }
        Some((host, meta?))
    };
    let mut out = Vec::new();
    for path in masked {
        match in_rootfs(path) {
            Some((_, meta)) if meta.is_dir() => {
                out.push(oci_mount(path, "tmpfs", Path::new("tmpfs"), &["ro", "nosuid", "nodev", "noexec"]))
            }
            Some(_) => out.push(oci_mount(path, "bind", Path::new("/dev/null"), &["rbind", "ro"])),
            None => {}
        }
    }
    for path in readonly {
        if let Some((host, _)) = in_rootfs(path) {
            out.push(oci_mount(path, "bind", &host, &["rbind", "rprivate", "ro"]));
        }
    }
    out
}

/// A shared or slave mount needs the rootfs to propagate too.
fn rootfs_propagation(mounts: &[Mount]) -> Option<&'static str> {
    if mounts.iter().any(|m| m.propagation == Propagation::Bidirectional) {
        Some("rshared")
    } else if mounts.iter().any(|m| m.propagation == Propagation::HostToContainer) {
        Some("rslave")
    } else {
        None
    }
}

/// The device nodes to create and the device cgroup rules: deny everything, then allow each
/// device; privileged containers get every host device and every access.
fn devices(c: &ContainerSpec, host: &HostInfo) -> Result<(Vec<LinuxDevice>, Vec<LinuxDeviceCgroup>), SpecError> {
    let rule = |allow: bool, typ: Option<LinuxDeviceType>, major: Option<i64>, minor: Option<i64>, access: &str| {
        let mut r = LinuxDeviceCgroup::default();
        r.set_allow(allow).set_typ(typ).set_major(major).set_minor(minor).set_access(Some(access.to_owned()));
        r
    };
    if c.privileged {
        return Ok((host.devices.clone(), vec![rule(true, None, None, None, "rwm")]));
    }
    let mut nodes = Vec::new();
    let mut rules = vec![rule(false, None, None, None, "rwm")];
    for d in &c.devices {
        let access = if d.permissions.is_empty() { "rwm" } else { d.permissions.as_str() };
        if access.is_empty() || !access.chars().all(|ch| matches!(ch, 'r' | 'w' | 'm')) {
            return Err(SpecError::Device {
                host_path: d.host_path.clone(),
                reason: format!("permissions {access:?}"),
            });
        }
        if !d.container_path.starts_with('/') {
            return Err(SpecError::Device {
                host_path: d.host_path.clone(),
                reason: format!("container path {:?} is not absolute", d.container_path),
            });
        }
        for (rel, mut node) in device_nodes(&d.host_path)? {
            let path = if rel.as_os_str().is_empty() {
                PathBuf::from(&d.container_path)
            } else {
                Path::new(&d.container_path).join(rel)
            };
            node.set_path(path);
            rules.push(rule(true, Some(node.typ()), Some(node.major()), Some(node.minor()), access));
            nodes.push(node);
        }
    }
    Ok((nodes, rules))
}

/// The device node at `host_path`, or every device node below it if it is a directory, each with
/// its path relative to `host_path`.
fn device_nodes(host_path: &Path) -> Result<Vec<(PathBuf, LinuxDevice)>, SpecError> {
    let err = |reason: String| SpecError::Device { host_path: host_path.to_path_buf(), reason };
    let meta = std::fs::metadata(host_path).map_err(|e| err(e.to_string()))?;
    if meta.is_dir() {
        let mut out = Vec::new();
        walk_devices(host_path, Path::new(""), &mut out).map_err(|e| err(e.to_string()))?;
        return Ok(out);
    }
    match device_of(host_path, &meta) {
        Some(node) => Ok(vec![(PathBuf::new(), node)]),
        None => Err(err("not a device node".to_owned())),
    }
}

fn walk_devices(root: &Path, rel: &Path, out: &mut Vec<(PathBuf, LinuxDevice)>) -> io::Result<()> {
    for entry in std::fs::read_dir(root.join(rel))? {
        let entry = entry?;
        let rel = rel.join(entry.file_name());
        let meta = std::fs::symlink_metadata(root.join(&rel))?;
        if meta.is_dir() {
            walk_devices(root, &rel, out)?;
        } else if let Some(node) = device_of(&root.join(&rel), &meta) {
            out.push((rel, node));
        }
    }
    Ok(())
}

fn device_of(path: &Path, meta: &std::fs::Metadata) -> Option<LinuxDevice> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let typ = if meta.file_type().is_char_device() {
        LinuxDeviceType::C
    } else if meta.file_type().is_block_device() {
        LinuxDeviceType::B
    } else {
        return None;
    };
    let rdev = meta.rdev();
    let mut d = LinuxDevice::default();
    d.set_path(path.to_path_buf())
        .set_typ(typ)
        .set_major(nix::sys::stat::major(rdev) as i64)
        .set_minor(nix::sys::stat::minor(rdev) as i64)
        .set_file_mode(Some(meta.mode() & 0o777))
        .set_uid(Some(meta.uid()))
        .set_gid(Some(meta.gid()));
    Some(d)
}

/// Every device node under the host's `/dev`, for privileged containers; the runtime's own
/// `/dev/pts`, `/dev/shm`, `/dev/mqueue`, `/dev/console` and `/dev/ptmx` are left out.
pub fn host_devices() -> io::Result<Vec<LinuxDevice>> {
    let mut out = Vec::new();
    walk_devices(Path::new("/dev"), Path::new(""), &mut out)?;
    let skip = ["pts", "shm", "mqueue", "fd", "console", "ptmx"];
    Ok(out
        .into_iter()
        .filter(|(rel, _)| !rel.iter().next().is_some_and(|first| skip.iter().any(|s| first == *s)))
        .map(|(rel, mut d)| {
            d.set_path(Path::new("/dev").join(rel));
            d
        })
        .collect())
}

#[cfg(test)]
mod tests;
