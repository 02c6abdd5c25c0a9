//! What `berth up` checks before it starts anything: facts about the machine gathered once
//! ([`Facts::gather`]), and [`check`], a pure function of them that names every missing thing with
//! the exact command that fixes it.
//!
//! | check | fact | fix |
//! |---|---|---|
//! | root | effective uid | run as root |
//! | overlayfs | `/proc/filesystems`, `/sys/module/overlay`, `modules.dep` | `modprobe overlay` |
//! | cgroups | `/proc/self/mountinfo`, `cgroup.controllers` | mount cgroup2 or the v1 controllers |
//! | CNI plugins | bridge, host-local, loopback, portmap in the plugin dirs | `apt-get install containernetworking-plugins` |
//! | iptables | on PATH | `apt-get install iptables` |
//! | busybox | `/bin/busybox`, statically linked (the runtime probes' rootfs) | `apt-get install busybox-static` |
//! | ports | the API and agent ports bind | stop the listener or pick another port |
//! | runtime socket | nothing answers on it | stop that runtime or pick another socket |

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The CNI plugins the runtime's network needs (`loopback` brings up `lo`).
pub const CNI_PLUGINS: [&str; 4] = ["bridge", "host-local", "loopback", "portmap"];
/// Where Debian's containernetworking-plugins and the upstream tarball install them.
pub const DEFAULT_CNI_BIN_DIRS: [&str; 2] = ["/usr/lib/cni", "/opt/cni/bin"];
/// The statically linked busybox the runtime probes run (Debian's busybox-static).
pub const BUSYBOX: &str = "/bin/busybox";
/// v1 controllers a pod's limits are written to.
const V1_CONTROLLERS: [&str; 5] = ["cpu", "cpuacct", "memory", "pids", "devices"];
/// v2 controllers a pod's limits are written to.
const V2_CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];

/// How cgroups are mounted at `/sys/fs/cgroup`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cgroups {
    /// cgroup2 at the root; its available controllers.
    V2 { controllers: BTreeSet<String> },
    /// v1 hierarchies (`/sys/fs/cgroup/<ctrl>`); with a cgroup2 mount beside them ("hybrid",
    /// `/sys/fs/cgroup/unified`), the controllers cgroup2 still owns.
    V1 { controllers: BTreeSet<String>, unified: Option<BTreeSet<String>> },
    /// Nothing mounted.
    None,
}

impl Cgroups {
    /// Hybrid hosts whose cgroup2 still owns controllers: crun refuses them.
    pub fn hybrid_owned(&self) -> Option<&BTreeSet<String>> {
        match self {
            Cgroups::V1 { unified: Some(owned), .. } if !owned.is_empty() => Some(owned),
            _ => None,
        }
    }

    /// Reads `/proc/self/mountinfo` and the cgroup2 controller lists.
    pub fn read() -> Cgroups {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let controllers_of = |dir: &str| -> BTreeSet<String> {
            std::fs::read_to_string(Path::new(dir).join("cgroup.controllers"))
                .unwrap_or_default()
                .split_whitespace()
                .map(String::from)
                .collect()
        };
        Cgroups::from_mountinfo(&mountinfo, controllers_of)
    }

    /// The layout from mountinfo's text; `controllers_of(dir)` reads a cgroup2 mount's controllers.
    pub fn from_mountinfo(mountinfo: &str, controllers_of: impl Fn(&str) -> BTreeSet<String>) -> Cgroups {
        let mut v1 = BTreeSet::new();
        let mut v2_root = false;
        let mut unified = None;
        for line in mountinfo.lines() {
            // `id parent maj:min root mountpoint options [optional…] - fstype source superoptions`
            let Some((left, right)) = line.split_once(" - ") else { continue };
            let Some(mountpoint) = left.split(' ').nth(4) else { continue };
            let mut right = right.split(' ');
            let (fstype, _source, super_options) = (right.next(), right.next(), right.next().unwrap_or(""));
            match fstype {
                Some("cgroup2") if mountpoint == "/sys/fs/cgroup" => v2_root = true,
                Some("cgroup2") if mountpoint.starts_with("/sys/fs/cgroup/") => {
                    unified = Some(controllers_of(mountpoint));
                }
                Some("cgroup") if mountpoint.starts_with("/sys/fs/cgroup/") => {
                    v1.extend(super_options.split(',').filter(|o| is_controller(o)).map(String::from));
                }
                _ => {}
            }
        }
        if v2_root {
            Cgroups::V2 { controllers: controllers_of("/sys/fs/cgroup") }
        } else if !v1.is_empty() {
            Cgroups::V1 { controllers: v1, unified }
        } else {
            Cgroups::None
        }
    }
}

/// Whether a v1 mount's super option names a controller (not `rw`, `xattr`, `name=systemd`…).
fn is_controller(option: &str) -> bool {
    const NOT_CONTROLLERS: [&str; 6] = ["rw", "ro", "xattr", "noprefix", "clone_children", "cpuset_v2_mode"];
    !option.is_empty() && !option.contains('=') && !NOT_CONTROLLERS.contains(&option)
}

/// `/bin/busybox` as found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Busybox {
    Missing,
    /// Needs a dynamic loader (Debian's `busybox`, not `busybox-static`).
    Dynamic,
    Static,
}

impl Busybox {
    pub fn read(path: &Path) -> Busybox {
        match std::fs::read(path) {
            Err(_) => Busybox::Missing,
            Ok(elf) if has_interpreter(&elf) => Busybox::Dynamic,
            Ok(_) => Busybox::Static,
        }
    }
}

/// Whether a 64-bit little-endian ELF file has a `PT_INTERP` program header (is dynamically
/// linked). Anything else counts as static.
fn has_interpreter(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    if elf.len() < 64 || &elf[..4] != b"\x7fELF" || elf[4] != 2 || elf[5] != 1 {
        return false;
    }
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u64_at = |o: usize| elf.get(o..o + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as usize);
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38)) else {
        return false;
    };
    (0..phnum).any(|i| {
        let at = phoff + i * phentsize;
        elf.get(at..at + 4).is_some_and(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) == PT_INTERP)
    })
}

/// A TCP port berth needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    pub port: u16,
    /// Whose port it is, for the message: "the API server's".
    pub owner: &'static str,
    /// The flag that changes it.
    pub flag: &'static str,
    pub free: bool,
}

/// Everything [`check`] looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    pub euid: u32,
    /// `/proc/filesystems` lists `overlay`, or the module is loaded or installed.
    pub overlay: bool,
    pub cgroups: Cgroups,
    /// The plugin dirs searched, in order.
    pub cni_bin_dirs: Vec<PathBuf>,
    /// The plugins of [`CNI_PLUGINS`] found in any of them.
    pub cni_found: BTreeSet<String>,
    pub iptables: Option<PathBuf>,
    pub busybox: Busybox,
    pub ports: Vec<Port>,
    /// The runtime socket, and whether something already answers on it.
    pub runtime_socket: (PathBuf, bool),
}

/// What to gather: the ports and socket `berth up` is going to use.
pub struct Wanted<'a> {
    pub cni_bin_dirs: &'a [PathBuf],
    pub ports: Vec<(u16, &'static str, &'static str)>,
    pub runtime_socket: &'a Path,
    pub search_path: &'a OsStr,
}

impl Facts {
    pub fn gather(wanted: &Wanted) -> Facts {
        let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
        let overlay = filesystems.lines().any(|l| l.split_whitespace().last() == Some("overlay"))
            || Path::new("/sys/module/overlay").exists()
            || overlay_module_installed();
        let cni_found = CNI_PLUGINS
            .iter()
            .filter(|p| wanted.cni_bin_dirs.iter().any(|d| is_executable(&d.join(p))))
            .map(|p| p.to_string())
            .collect();
        let ports =
            wanted.ports.iter().map(|&(port, owner, flag)| Port { port, owner, flag, free: port_free(port) }).collect();
        let socket = wanted.runtime_socket.to_path_buf();
        let answering = std::os::unix::net::UnixStream::connect(&socket).is_ok();
        Facts {
            euid: rustix::process::geteuid().as_raw(),
            overlay,
            cgroups: Cgroups::read(),
            cni_bin_dirs: wanted.cni_bin_dirs.to_vec(),
            cni_found,
            iptables: berth_runtime::config::find_on_path("iptables", wanted.search_path).or_else(|| {
                ["/usr/sbin/iptables", "/sbin/iptables"].iter().map(PathBuf::from).find(|p| is_executable(p))
            }),
            busybox: Busybox::read(Path::new(BUSYBOX)),
            ports,
            runtime_socket: (socket, answering),
        }
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn overlay_module_installed() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let deps = std::fs::read_to_string(format!("/lib/modules/{}/modules.dep", release.trim())).unwrap_or_default();
    deps.lines().any(|l| l.split(':').next().is_some_and(|m| m.ends_with("/overlay.ko") || m.contains("/overlay.ko.")))
}

/// Whether nothing listens on `port` (on any address: the agent binds 0.0.0.0).
fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// `a`, `a and b`, `a, b and c`.
fn and_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// Every problem, each with its fix, in the order of the table above; empty when the machine
/// is ready.
pub fn check(f: &Facts) -> Vec<String> {
    let mut problems = Vec::new();
    if f.euid != 0 {
        problems.push(
            "berth up must run as root (it mounts filesystems and makes namespaces, cgroups and network \
             devices): run it as root, e.g. sudo berth up"
                .to_string(),
        );
    }
    if !f.overlay {
        problems.push(
            "the kernel has no overlay filesystem (container root filesystems are overlayfs mounts): \
             modprobe overlay, or use a kernel built with CONFIG_OVERLAY_FS"
                .to_string(),
        );
    }
    match &f.cgroups {
        Cgroups::None => problems.push(
            "no cgroup filesystem is mounted at /sys/fs/cgroup (pods' limits are cgroups): mount -t cgroup2 \
             none /sys/fs/cgroup (cgroup v2), or mount the v1 controllers at /sys/fs/cgroup/<controller>"
                .to_string(),
        ),
        Cgroups::V1 { controllers, .. } => {
            let missing: Vec<&str> = V1_CONTROLLERS.iter().copied().filter(|c| !controllers.contains(*c)).collect();
            if !missing.is_empty() {
                let mounts: Vec<String> = missing
                    .iter()
                    .map(|c| format!("mkdir -p /sys/fs/cgroup/{c} && mount -t cgroup -o {c} cgroup /sys/fs/cgroup/{c}"))
                    .collect();
                problems.push(format!(
                    "cgroup v1 controllers not mounted: {} (pods' limits are written there): {}",
                    missing.join(", "),
                    mounts.join("; ")
                ));
            }
        }
        Cgroups::V2 { controllers } => {
            let missing: Vec<&str> = V2_CONTROLLERS.iter().copied().filter(|c| !controllers.contains(*c)).collect();
            if !missing.is_empty() {
                problems.push(format!(
                    "cgroup v2 controllers not available: {} (pods' limits are written there): remove \
                     cgroup_disable= for them from the kernel command line and reboot",
                    missing.join(", ")
                ));
            }
        }
    }
    let missing: Vec<&str> = CNI_PLUGINS.iter().copied().filter(|p| !f.cni_found.contains(*p)).collect();
    if !missing.is_empty() {
        let dirs: Vec<String> = f.cni_bin_dirs.iter().map(|d| d.display().to_string()).collect();
        problems.push(format!(
            "missing CNI plugins in {}: {} (install Debian's containernetworking-plugins: apt-get install \
             containernetworking-plugins)",
            and_list(&dirs),
            missing.join(", ")
        ));
    }
    if f.iptables.is_none() {
        problems.push(
            "iptables is not installed (the CNI bridge and portmap plugins program it): apt-get install iptables"
                .to_string(),
        );
    }
    match f.busybox {
        Busybox::Static => {}
        Busybox::Missing => problems.push(format!(
            "{BUSYBOX} is missing (berth up proves each OCI runtime by running a tiny busybox container): \
             apt-get install busybox-static"
        )),
        Busybox::Dynamic => problems.push(format!(
            "{BUSYBOX} is not statically linked (berth up proves each OCI runtime by running it alone in a \
             container): apt-get install busybox-static"
        )),
    }
    for p in f.ports.iter().filter(|p| !p.free) {
        problems.push(format!(
            "port {port} ({owner}) is already in use: stop what listens there (ss -ltnp 'sport = :{port}' \
             shows it), or pass {flag} PORT",
            port = p.port,
            owner = p.owner,
            flag = p.flag
        ));
    }
    let (socket, answering) = &f.runtime_socket;
    if *answering {
        problems.push(format!(
            "the runtime socket {} is already served by another process: stop that runtime, or pass \
             --runtime-socket PATH",
            socket.display()
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready() -> Facts {
        Facts {
            euid: 0,
            overlay: true,
            cgroups: Cgroups::V1 {
                controllers: V1_CONTROLLERS.iter().map(|c| c.to_string()).collect(),
                unified: Some(BTreeSet::new()),
            },
            cni_bin_dirs: DEFAULT_CNI_BIN_DIRS.iter().map(PathBuf::from).collect(),
            cni_found: CNI_PLUGINS.iter().map(|p| p.to_string()).collect(),
            iptables: Some("/usr/sbin/iptables".into()),
            busybox: Busybox::Static,
            ports: vec![Port { port: 6443, owner: "the API server's", flag: "--secure-port", free: true }],
            runtime_socket: ("/run/berth/runtime.sock".into(), false),
        }
    }

    #[test]
    fn a_ready_machine_has_no_problems() {
        assert_eq!(check(&ready()), Vec::<String>::new());
    }

    #[test]
    fn missing_cni_plugins_are_named_with_the_dirs_searched_and_the_package() {
        let mut f = ready();
        f.cni_found = ["loopback", "portmap"].iter().map(|p| p.to_string()).collect();
        assert_eq!(
            check(&f),
            vec![
                "missing CNI plugins in /usr/lib/cni and /opt/cni/bin: bridge, host-local (install Debian's \
                 containernetworking-plugins: apt-get install containernetworking-plugins)"
            ]
        );
        f.cni_bin_dirs = vec!["/x".into()];
        f.cni_found.clear();
        assert!(check(&f)[0].starts_with("missing CNI plugins in /x: bridge, host-local, loopback, portmap ("));
    }

    #[test]
    fn every_problem_is_listed_at_once() {
        let mut f = ready();
        f.euid = 1000;
        f.overlay = false;
        f.cgroups = Cgroups::None;
        f.iptables = None;
        f.busybox = Busybox::Dynamic;
        f.ports[0].free = false;
        f.runtime_socket.1 = true;
        let problems = check(&f);
        assert_eq!(problems.len(), 7, "{problems:#?}");
        assert!(problems[0].starts_with("berth up must run as root"));
        assert!(problems[1].contains("modprobe overlay"));
        assert!(problems[2].contains("mount -t cgroup2 none /sys/fs/cgroup"));
        assert!(problems[3].contains("apt-get install iptables"));
        assert!(problems[4].contains("apt-get install busybox-static"));
        assert_eq!(
            problems[5],
            "port 6443 (the API server's) is already in use: stop what listens there (ss -ltnp 'sport = :6443' \
             shows it), or pass --secure-port PORT"
        );
        assert!(problems[6].contains("/run/berth/runtime.sock is already served"));
    }

    #[test]
    fn missing_cgroup_controllers_are_named_with_their_mounts() {
        let mut f = ready();
        f.cgroups = Cgroups::V1 {
            controllers: ["cpu", "cpuacct", "devices"].iter().map(|c| c.to_string()).collect(),
            unified: None,
        };
        let problems = check(&f);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].starts_with("cgroup v1 controllers not mounted: memory, pids ("), "{}", problems[0]);
        assert!(problems[0].contains("mount -t cgroup -o memory cgroup /sys/fs/cgroup/memory"));
        f.cgroups = Cgroups::V2 { controllers: ["cpu", "pids"].iter().map(|c| c.to_string()).collect() };
        assert!(check(&f)[0].starts_with("cgroup v2 controllers not available: memory ("));
    }

    #[test]
    fn the_cgroup_layout_is_read_from_mountinfo() {
        let hybrid = "\
30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
33 30 0:29 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
34 30 0:30 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
";
        let owned = |dir: &str| -> BTreeSet<String> {
            assert_eq!(dir, "/sys/fs/cgroup/unified");
            ["hugetlb".to_string()].into()
        };
        let layout = Cgroups::from_mountinfo(hybrid, owned);
        assert_eq!(
            layout,
            Cgroups::V1 {
                controllers: ["cpu", "memory"].iter().map(|c| c.to_string()).collect(),
                unified: Some(["hugetlb".to_string()].into()),
            }
        );
        assert_eq!(layout.hybrid_owned().map(|o| o.len()), Some(1));
        let v2 = "40 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let all = |_: &str| -> BTreeSet<String> { ["cpu".to_string(), "memory".to_string()].into() };
        assert!(matches!(Cgroups::from_mountinfo(v2, all), Cgroups::V2 { controllers } if controllers.len() == 2));
        assert_eq!(Cgroups::from_mountinfo("", all), Cgroups::None);
    }

    #[test]
    fn this_hosts_busybox_is_static_and_a_dynamic_binary_is_told_apart() {
        // The test binary itself is dynamically linked.
        let me = std::env::current_exe().unwrap();
        assert_eq!(Busybox::read(&me), Busybox::Dynamic);
        assert_eq!(Busybox::read(Path::new("/nonexistent/busybox")), Busybox::Missing);
    }
}
