//! The pod-level cgroup kubelet's cgroupfs driver makes — `/kubepods/burstable/pod<uid>`,
//! `/kubepods/besteffort/pod<uid>`, or `/kubepods/pod<uid>` for Guaranteed pods — holding the
//! pod's summed requests and limits plus its RuntimeClass overhead. It is the sandbox's
//! `cgroup_parent`, so every container of the pod (each in a cgroup of its own below it) shares
//! those limits. cgroup v1 (one hierarchy per controller, hybrid hosts included) and v2.

use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;

/// The cgroup path of a pod, relative to each hierarchy's root.
pub fn pod_path(qos: &str, uid: &str) -> String {
    match qos {
        "Guaranteed" => format!("/kubepods/pod{uid}"),
        "BestEffort" => format!("/kubepods/besteffort/pod{uid}"),
        _ => format!("/kubepods/burstable/pod{uid}"),
    }
}

/// Makes and removes pod cgroups.
pub trait Cgroups: Send + Sync + std::fmt::Debug {
    /// Creates the cgroup at `path` (and its parents) with `limits`; an existing one gets them again.
    fn create(&self, path: &str, limits: &cri::LinuxContainerResources) -> std::io::Result<()>;
    /// Removes the cgroup at `path` and any empty cgroups left below it, in every hierarchy.
    fn remove(&self, path: &str) -> std::io::Result<()>;
}

/// cgroupfs under `root` (normally `/sys/fs/cgroup`).
#[derive(Debug)]
pub struct CgroupFs {
    root: PathBuf,
}

impl CgroupFs {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        CgroupFs { root: root.into() }
    }

    /// A unified (v2) hierarchy at the root, as opposed to v1 controllers in subdirectories.
    fn unified(&self) -> bool {
        self.root.join("cgroup.controllers").is_file()
    }

    fn rel(path: &str) -> &str {
        path.trim_start_matches('/')
    }
}

fn write(dir: &Path, file: &str, value: &str) -> std::io::Result<()> {
    std::fs::write(dir.join(file), value)
        .map_err(|e| std::io::Error::new(e.kind(), format!("writing {} to {}: {e}", value, dir.join(file).display())))
}

/// cgroup v2's `cpu.weight` for v1 shares (the conversion runc and kubelet use).
pub fn shares_to_weight(shares: i64) -> i64 {
    if shares <= 0 {
        return 100;
    }
    1 + ((shares.clamp(2, 262_144) - 2) * 9999) / 262_142
}

impl Cgroups for CgroupFs {
    fn create(&self, path: &str, r: &cri::LinuxContainerResources) -> std::io::Result<()> {
        let rel = Self::rel(path);
        if self.unified() {
            // Each ancestor must hand the cpu and memory controllers down.
            let mut dir = self.root.clone();
            for part in Path::new(rel).components() {
                let _ = write(&dir, "cgroup.subtree_control", "+cpu +memory +pids");
                dir.push(part);
                std::fs::create_dir_all(&dir)?;
            }
            if r.cpu_shares > 0 {
                write(&dir, "cpu.weight", &shares_to_weight(r.cpu_shares).to_string())?;
            }
            let period = if r.cpu_period > 0 { r.cpu_period } else { 100_000 };
            let quota = if r.cpu_quota > 0 { r.cpu_quota.to_string() } else { "max".into() };
            write(&dir, "cpu.max", &format!("{quota} {period}"))?;
            let memory = if r.memory_limit_in_bytes > 0 { r.memory_limit_in_bytes.to_string() } else { "max".into() };
            write(&dir, "memory.max", &memory)?;
            return Ok(());
        }
        let cpu = self.root.join("cpu").join(rel);
        std::fs::create_dir_all(&cpu)?;
        if r.cpu_shares > 0 {
            write(&cpu, "cpu.shares", &r.cpu_shares.to_string())?;
        }
        if r.cpu_quota > 0 {
            write(&cpu, "cpu.cfs_period_us", &r.cpu_period.max(1000).to_string())?;
            write(&cpu, "cpu.cfs_quota_us", &r.cpu_quota.to_string())?;
        } else {
            write(&cpu, "cpu.cfs_quota_us", "-1")?;
        }
        let memory = self.root.join("memory").join(rel);
        std::fs::create_dir_all(&memory)?;
        if r.memory_limit_in_bytes > 0 {
            write(&memory, "memory.limit_in_bytes", &r.memory_limit_in_bytes.to_string())?;
        }
        Ok(())
    }

    fn remove(&self, path: &str) -> std::io::Result<()> {
        let rel = Self::rel(path);
        let mut dirs = vec![self.root.join(rel)];
        if !self.unified() {
            dirs = std::fs::read_dir(&self.root)?
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir() || t.is_symlink()))
                .map(|e| e.path().join(rel))
                .collect();
        }
        let mut first_error = None;
        for dir in dirs {
            if let Err(e) = remove_tree(&dir) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// rmdir of a cgroup and its descendants, deepest first (cgroup dirs hold only kernel files, so
/// rmdir is all it takes; one with processes refuses).
fn remove_tree(dir: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&e.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> cri::LinuxContainerResources {
        cri::LinuxContainerResources {
            cpu_shares: 512,
            cpu_period: 100_000,
            cpu_quota: 50_000,
            memory_limit_in_bytes: 64 << 20,
            ..Default::default()
        }
    }

    fn read(p: PathBuf) -> String {
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn pods_go_under_their_qos_class_like_kubelets_cgroupfs_driver() {
        assert_eq!(pod_path("Guaranteed", "u"), "/kubepods/podu");
        assert_eq!(pod_path("Burstable", "u"), "/kubepods/burstable/podu");
        assert_eq!(pod_path("BestEffort", "u"), "/kubepods/besteffort/podu");
    }

    #[test]
    fn v1_limits_go_to_the_cpu_and_memory_hierarchies() {
        let root = tempfile::tempdir().unwrap();
        for h in ["cpu", "memory", "pids"] {
            std::fs::create_dir(root.path().join(h)).unwrap();
        }
        let fs = CgroupFs::new(root.path());
        fs.create("/kubepods/burstable/podu", &limits()).unwrap();
        let cpu = root.path().join("cpu/kubepods/burstable/podu");
        assert_eq!(read(cpu.join("cpu.shares")), "512");
        assert_eq!(
            (read(cpu.join("cpu.cfs_period_us")), read(cpu.join("cpu.cfs_quota_us"))),
            ("100000".into(), "50000".into())
        );
        assert_eq!(
            read(root.path().join("memory/kubepods/burstable/podu/memory.limit_in_bytes")),
            (64 << 20).to_string()
        );
        // The runtime made container cgroups below, in any hierarchy; they go too.
        std::fs::create_dir_all(root.path().join("pids/kubepods/burstable/podu/c1")).unwrap();
        for f in ["cpu.shares", "cpu.cfs_period_us", "cpu.cfs_quota_us"] {
            std::fs::remove_file(cpu.join(f)).unwrap();
        }
        std::fs::remove_file(root.path().join("memory/kubepods/burstable/podu/memory.limit_in_bytes")).unwrap();
        fs.remove("/kubepods/burstable/podu").unwrap();
        for h in ["cpu", "memory", "pids"] {
            assert!(!root.path().join(h).join("kubepods/burstable/podu").exists(), "{h}");
            assert!(root.path().join(h).join("kubepods/burstable").exists() || h == "pids", "the QoS cgroup stays");
        }
    }

    #[test]
    fn v2_limits_use_weight_max_and_enable_controllers_on_the_way_down() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("cgroup.controllers"), "cpu memory pids").unwrap();
        let fs = CgroupFs::new(root.path());
        let unlimited = cri::LinuxContainerResources { cpu_shares: 2, ..Default::default() };
        fs.create("/kubepods/besteffort/podu", &unlimited).unwrap();
        let dir = root.path().join("kubepods/besteffort/podu");
        assert_eq!(read(dir.join("cpu.weight")), "1");
        assert_eq!(read(dir.join("cpu.max")), "max 100000");
        assert_eq!(read(dir.join("memory.max")), "max");
        assert_eq!(read(root.path().join("kubepods/cgroup.subtree_control")), "+cpu +memory +pids");
        fs.create("/kubepods/podg", &limits()).unwrap();
        let g = root.path().join("kubepods/podg");
        assert_eq!(read(g.join("cpu.weight")), shares_to_weight(512).to_string());
        assert_eq!(read(g.join("cpu.max")), "50000 100000");
        assert_eq!(read(g.join("memory.max")), (64 << 20).to_string());
    }

    #[test]
    fn shares_convert_to_weights_as_runc_does() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(262_144), 10_000);
    }
}
