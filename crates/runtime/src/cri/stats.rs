//! CRI stats: ContainerStats, ListContainerStats, PodSandboxStats and ListPodSandboxStats, read
//! from the containers' cgroups (v1 hierarchies, or the unified v2 one) and their writable layers.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use k8s_cri::v1 as cri;

use super::{Cri, Error};
use crate::state::{ContainerFilter, ContainerRecord, SandboxFilter, SandboxRecord, now_ns};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The previous CPU sample per cgroup, for `usage_nano_cores`.
#[derive(Default)]
pub(crate) struct CpuSamples(Mutex<HashMap<String, (i64, u64)>>);

impl CpuSamples {
    /// The usage rate since the previous sample of `key`, in nanocores.
    fn rate(&self, key: &str, now: i64, usage: u64) -> Option<u64> {
        let mut samples = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let previous = samples.insert(key.to_string(), (now, usage));
        let (then, before) = previous?;
        let elapsed = u64::try_from(now - then).ok().filter(|e| *e > 0)?;
        Some(usage.saturating_sub(before).saturating_mul(1_000_000_000) / elapsed)
    }
}

fn read_u64(path: impl AsRef<Path>) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn stat_field(path: impl AsRef<Path>, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

fn unified() -> bool {
    !Path::new(CGROUP_ROOT).join("cpuacct").exists() && Path::new(CGROUP_ROOT).join("cgroup.controllers").exists()
}

/// Cumulative CPU time (ns) of a cgroup (path relative to the hierarchy's root).
fn cpu_usage(cgroup: &str) -> Option<u64> {
    let rel = cgroup.trim_start_matches('/');
    if unified() {
        stat_field(Path::new(CGROUP_ROOT).join(rel).join("cpu.stat"), "usage_usec").map(|us| us * 1000)
    } else {
        read_u64(Path::new(CGROUP_ROOT).join("cpuacct").join(rel).join("cpuacct.usage"))
    }
}

/// (usage, working set, rss, page faults, major page faults, limit) of a cgroup's memory.
fn memory(cgroup: &str) -> Option<(u64, u64, u64, u64, u64, Option<u64>)> {
    let rel = cgroup.trim_start_matches('/');
    if unified() {
        let dir = Path::new(CGROUP_ROOT).join(rel);
        let usage = read_u64(dir.join("memory.current"))?;
        let stat = dir.join("memory.stat");
        let inactive = stat_field(&stat, "inactive_file").unwrap_or(0);
        let limit = read_u64(dir.join("memory.max"));
        Some((
            usage,
            usage.saturating_sub(inactive),
            stat_field(&stat, "anon").unwrap_or(0),
            stat_field(&stat, "pgfault").unwrap_or(0),
            stat_field(&stat, "pgmajfault").unwrap_or(0),
            limit,
        ))
    } else {
        let dir = Path::new(CGROUP_ROOT).join("memory").join(rel);
        let usage = read_u64(dir.join("memory.usage_in_bytes"))?;
        let stat = dir.join("memory.stat");
        let inactive = stat_field(&stat, "total_inactive_file").unwrap_or(0);
        let limit = read_u64(dir.join("memory.limit_in_bytes")).filter(|l| *l < (1 << 62));
        Some((
            usage,
            usage.saturating_sub(inactive),
            stat_field(&stat, "total_rss").unwrap_or(0),
            stat_field(&stat, "total_pgfault").unwrap_or(0),
            stat_field(&stat, "total_pgmajfault").unwrap_or(0),
            limit,
        ))
    }
}

/// Bytes and inodes used under `dir` (not following symlinks, not crossing mounts).
fn disk_usage(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let Ok(root) = std::fs::symlink_metadata(dir) else { return (0, 0) };
    let (mut bytes, mut inodes) = (0u64, 0u64);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            bytes += meta.blocks() * 512;
            inodes += 1;
            if meta.is_dir() && meta.dev() == root.dev() {
                stack.push(entry.path());
            }
        }
    }
    (bytes, inodes)
}

fn u64_value(value: u64) -> Option<cri::UInt64Value> {
    Some(cri::UInt64Value { value })
}

/// The cgroup the OCI spec in `bundle` names (`linux.cgroupsPath`).
pub(crate) fn spec_cgroup(bundle: &Path) -> Option<String> {
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(bundle.join("config.json")).ok()?).ok()?;
    spec["linux"]["cgroupsPath"].as_str().map(str::to_owned)
}

impl Cri {
    fn cpu_stats(&self, cgroup: &str, now: i64) -> Option<cri::CpuUsage> {
        let usage = cpu_usage(cgroup)?;
        Some(cri::CpuUsage {
            timestamp: now,
            usage_core_nano_seconds: u64_value(usage),
            usage_nano_cores: self.cpu_samples.rate(cgroup, now, usage).and_then(u64_value),
        })
    }

    fn memory_stats(&self, cgroup: &str, now: i64) -> Option<cri::MemoryUsage> {
        let (usage, working_set, rss, faults, major, limit) = memory(cgroup)?;
        Some(cri::MemoryUsage {
            timestamp: now,
            working_set_bytes: u64_value(working_set),
            available_bytes: limit.map(|l| l.saturating_sub(working_set)).and_then(u64_value),
            usage_bytes: u64_value(usage),
            rss_bytes: u64_value(rss),
            page_faults: u64_value(faults),
            major_page_faults: u64_value(major),
        })
    }

    fn stats_of(&self, record: &ContainerRecord) -> cri::ContainerStats {
        let now = now_ns();
        let cgroup = spec_cgroup(&record.bundle);
        let upper = self.store.container_dir(&record.id).join("upper");
        let (used, inodes) = disk_usage(&upper);
        cri::ContainerStats {
            attributes: Some(cri::ContainerAttributes {
                id: record.id.clone(),
                metadata: Some(cri::ContainerMetadata {
                    name: record.metadata.name.clone(),
                    attempt: record.metadata.attempt,
                }),
                labels: record.labels.clone().into_iter().collect(),
                annotations: record.annotations.clone().into_iter().collect(),
            }),
            cpu: cgroup.as_deref().and_then(|c| self.cpu_stats(c, now)),
            memory: cgroup.as_deref().and_then(|c| self.memory_stats(c, now)),
            writable_layer: Some(cri::FilesystemUsage {
                timestamp: now,
                fs_id: Some(cri::FilesystemIdentifier { mountpoint: upper.to_string_lossy().into_owned() }),
                used_bytes: u64_value(used),
                inodes_used: u64_value(inodes),
            }),
            swap: None,
        }
    }

    pub fn container_stats(&self, req: cri::ContainerStatsRequest) -> Result<cri::ContainerStatsResponse, Error> {
        let record = self.store.container(&req.container_id)?;
        Ok(cri::ContainerStatsResponse { stats: Some(self.stats_of(&record)) })
    }

    pub fn list_container_stats(&self, req: cri::ListContainerStatsRequest) -> cri::ListContainerStatsResponse {
        let filter = req
            .filter
            .map(|f| ContainerFilter {
                id: (!f.id.is_empty()).then_some(f.id),
                sandbox_id: (!f.pod_sandbox_id.is_empty()).then_some(f.pod_sandbox_id),
                labels: f.label_selector.into_iter().collect(),
                state: None,
            })
            .unwrap_or_default();
        let stats = self.store.list_containers(&filter).iter().map(|c| self.stats_of(c)).collect();
        cri::ListContainerStatsResponse { stats }
    }

    /// The pod's cgroup: the parent its containers were created under.
    pub(crate) fn sandbox_cgroup(&self, record: &SandboxRecord) -> String {
        self.own_sandbox_cgroup(record).unwrap_or_else(|| record.cgroup_parent.clone())
    }

    /// The pod's cgroup when the runtime made it (no cgroup parent given), and so removes it; a
    /// given parent belongs to whoever gave it (kubelet).
    pub(crate) fn own_sandbox_cgroup(&self, record: &SandboxRecord) -> Option<String> {
        record.cgroup_parent.is_empty().then(|| format!("/berth/{}", record.id))
    }

    fn sandbox_stats_of(&self, record: &SandboxRecord) -> cri::PodSandboxStats {
        let now = now_ns();
        let cgroup = self.sandbox_cgroup(record);
        let containers: Vec<cri::ContainerStats> =
            self.store.containers_in(&record.id).iter().map(|c| self.stats_of(c)).collect();
        let m = &record.metadata;
        cri::PodSandboxStats {
            attributes: Some(cri::PodSandboxAttributes {
                id: record.id.clone(),
                metadata: Some(cri::PodSandboxMetadata {
                    name: m.name.clone(),
                    uid: m.uid.clone(),
                    namespace: m.namespace.clone(),
                    attempt: m.attempt,
                }),
                labels: record.labels.clone().into_iter().collect(),
                annotations: record.annotations.clone().into_iter().collect(),
            }),
            linux: Some(cri::LinuxPodSandboxStats {
                cpu: self.cpu_stats(&cgroup, now),
                memory: self.memory_stats(&cgroup, now),
                network: None,
                process: Some(cri::ProcessUsage { timestamp: now, process_count: u64_value(process_count(&cgroup)) }),
                containers,
            }),
            windows: None,
        }
    }

    pub fn pod_sandbox_stats(&self, req: cri::PodSandboxStatsRequest) -> Result<cri::PodSandboxStatsResponse, Error> {
        let record = self.store.sandbox(&req.pod_sandbox_id)?;
        Ok(cri::PodSandboxStatsResponse { stats: Some(self.sandbox_stats_of(&record)) })
    }

    pub fn list_pod_sandbox_stats(&self, req: cri::ListPodSandboxStatsRequest) -> cri::ListPodSandboxStatsResponse {
        let filter = req
            .filter
            .map(|f| SandboxFilter {
                id: (!f.id.is_empty()).then_some(f.id),
                labels: f.label_selector.into_iter().collect(),
                state: None,
            })
            .unwrap_or_default();
        let stats = self.store.list_sandboxes(&filter).iter().map(|s| self.sandbox_stats_of(s)).collect();
        cri::ListPodSandboxStatsResponse { stats }
    }
}

/// Processes in a cgroup and its children (the pids controller's count on v1).
fn process_count(cgroup: &str) -> u64 {
    let rel = cgroup.trim_start_matches('/');
    let dir: PathBuf =
        if unified() { Path::new(CGROUP_ROOT).join(rel) } else { Path::new(CGROUP_ROOT).join("pids").join(rel) };
    read_u64(dir.join("pids.current")).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_rate_needs_two_samples_and_divides_by_the_elapsed_time() {
        let samples = CpuSamples::default();
        assert_eq!(samples.rate("c", 1_000_000_000, 500), None);
        // 0.5 s of CPU over 2 s: half a core.
        assert_eq!(samples.rate("c", 3_000_000_000, 500 + 1_000_000_000), Some(500_000_000));
    }

    #[test]
    fn stat_fields_are_found_by_whole_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("memory.stat");
        std::fs::write(&file, "inactive_file_x 1\ninactive_file 4096\n").unwrap();
        assert_eq!(stat_field(&file, "inactive_file"), Some(4096));
    }
}
