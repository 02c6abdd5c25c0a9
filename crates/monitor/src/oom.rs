//! The OOM-kill counter of a container's memory cgroup (`oom_kill` in cgroup v1's
//! `memory.oom_control` or cgroup v2's `memory.events`), found from `/proc/<pid>/cgroup`.

use std::fs;
use std::path::{Path, PathBuf};

/// The file that counts OOM kills in one memory cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomCounter {
    file: PathBuf,
}

impl OomCounter {
    /// The counter of the memory cgroup `pid` is in, if that can be found.
    pub fn of_process(pid: i32) -> Option<Self> {
        let cgroups = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        Self::from_proc_cgroup(&cgroups, Path::new("/sys/fs/cgroup"), v2)
    }

    /// Parses `/proc/<pid>/cgroup` text; `v2` says whether `root` is a unified (cgroup v2) mount.
    fn from_proc_cgroup(text: &str, root: &Path, v2: bool) -> Option<Self> {
        text.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let rel = path.trim_start_matches('/');
            if v2 && controllers.is_empty() {
                Some(OomCounter { file: root.join(rel).join("memory.events") })
            } else if !v2 && controllers.split(',').any(|c| c == "memory") {
                Some(OomCounter { file: root.join("memory").join(rel).join("memory.oom_control") })
            } else {
                None
            }
        })
    }

    /// The number of OOM kills so far, or `None` if the cgroup is gone or the kernel has no count.
    pub fn read(&self) -> Option<u64> {
        parse_oom_kill(&fs::read_to_string(&self.file).ok()?)
    }
}

fn parse_oom_kill(text: &str) -> Option<u64> {
    text.lines().find_map(|line| line.strip_prefix("oom_kill ")?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v1_memory_controller_line_names_the_oom_control_file() {
        let text = "12:pids:/a\n4:cpu,memory:/berth/c1\n0::/\n";
        let counter = OomCounter::from_proc_cgroup(text, Path::new("/sys/fs/cgroup"), false).unwrap();
        assert_eq!(counter.file, Path::new("/sys/fs/cgroup/memory/berth/c1/memory.oom_control"));
    }

    #[test]
    fn the_v2_unified_line_names_the_memory_events_file() {
        let counter = OomCounter::from_proc_cgroup("0::/berth/c1\n", Path::new("/sys/fs/cgroup"), true).unwrap();
        assert_eq!(counter.file, Path::new("/sys/fs/cgroup/berth/c1/memory.events"));
    }

    #[test]
    fn the_oom_kill_count_is_read_from_either_file_format() {
        assert_eq!(parse_oom_kill("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"), Some(2));
        assert_eq!(parse_oom_kill("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\noom_group_kill 0\n"), Some(1));
        assert_eq!(parse_oom_kill("oom_kill_disable 0\nunder_oom 0\n"), None);
    }
}
