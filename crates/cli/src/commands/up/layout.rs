//! Where `berth up` keeps everything in its data dir, the supervisor's state file that
//! `berth status` reads, and how `berth up`, `down` and `status` tell whether a supervisor is
//! alive (its lock, its pidfile and `/proc`).
//!
//! ```text
//! D/admin.kubeconfig        written by `berth server` (with its store, CA and tokens, also in D)
//! D/up.pid                  the supervisor's pid
//! D/up.lock                 held (flock) by the supervisor for its whole life
//! D/up.json                 the supervisor's state: parts, pids, restarts, runtimes found
//! D/logs/{up,server,runtime,agent}.log
//! D/runtime/runtime.toml    the runtime's config, written on each start (handlers that work)
//! D/runtime/discovery.json  what the runtime discovery found
//! D/runtime/cni/net.d/      the pod network's conflist; D/runtime/cni/networks/ its IPAM state
//! D/runtime/...             the runtime's root (images, sandboxes, containers)
//! D/agent/                  the agent's root dir; D/agent/node.kubeconfig its credentials
//! ```

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use super::discovery::Probe;

pub use crate::commands::server::DEFAULT_DATA_DIR;

/// The paths of one data dir (always absolute).
#[derive(Clone, Debug)]
pub struct Layout {
    pub data_dir: PathBuf,
}

impl Layout {
    pub fn new(data_dir: &Path) -> anyhow::Result<Layout> {
        let data_dir = std::path::absolute(data_dir).context("--data-dir")?;
        Ok(Layout { data_dir })
    }

    /// The Service proxy's nftables table: `berth` for the default data dir, a name of its own
    /// for any other, so a second cluster on the host (a test's) never rewrites the first's rules.
    pub fn proxy_table(&self) -> String {
        if self.data_dir == Path::new(DEFAULT_DATA_DIR) {
            return berth_agent::config::DEFAULT_PROXY_TABLE.to_string();
        }
        // FNV-1a: stable across runs and builds, unlike the standard library's hasher.
        let hash = self
            .data_dir
            .as_os_str()
            .as_encoded_bytes()
            .iter()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
        format!("berth-{:08x}", hash as u32)
    }

    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.data_dir.join("admin.kubeconfig")
    }

    pub fn pidfile(&self) -> PathBuf {
        self.data_dir.join("up.pid")
    }

    pub fn lockfile(&self) -> PathBuf {
        self.data_dir.join("up.lock")
    }

    pub fn state_file(&self) -> PathBuf {
        self.data_dir.join("up.json")
    }

    pub fn logs_dir(&self) -> PathBuf {
        self.data_dir.join("logs")
    }

    /// `D/logs/<part>.log` (`up` is the supervisor's own).
    pub fn log(&self, part: &str) -> PathBuf {
        self.logs_dir().join(format!("{part}.log"))
    }

    pub fn runtime_dir(&self) -> PathBuf {
        self.data_dir.join("runtime")
    }

    pub fn runtime_config(&self) -> PathBuf {
        self.runtime_dir().join("runtime.toml")
    }

    pub fn discovery_file(&self) -> PathBuf {
        self.runtime_dir().join("discovery.json")
    }

    pub fn cni_conf_dir(&self) -> PathBuf {
        self.runtime_dir().join("cni/net.d")
    }

    pub fn ipam_dir(&self) -> PathBuf {
        self.runtime_dir().join("cni/networks")
    }

    /// Scratch space of the runtime probes (emptied after each).
    pub fn probe_dir(&self) -> PathBuf {
        self.runtime_dir().join("probe")
    }

    pub fn agent_dir(&self) -> PathBuf {
        self.data_dir.join("agent")
    }

    pub fn node_kubeconfig(&self) -> PathBuf {
        self.agent_dir().join("node.kubeconfig")
    }

    /// The `--data-dir D` to append to a suggested command, empty for the default dir.
    pub fn flag(&self) -> String {
        if self.data_dir == Path::new(DEFAULT_DATA_DIR) {
            String::new()
        } else {
            format!(" --data-dir {}", self.data_dir.display())
        }
    }
}

/// A part's state as the supervisor reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PartState {
    /// Not started yet (waiting for the parts it needs).
    Waiting,
    Running,
    /// Exited; started again after its back-off.
    Restarting,
    Stopped,
}

impl std::fmt::Display for PartState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PartState::Waiting => "waiting",
            PartState::Running => "running",
            PartState::Restarting => "restarting",
            PartState::Stopped => "stopped",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PartStatus {
    pub name: String,
    pub state: PartState,
    pub pid: Option<u32>,
    pub restarts: u32,
    /// When the current process started (running), or when it will (restarting).
    pub since: Option<jiff::Timestamp>,
    pub last_exit: Option<String>,
    pub log: PathBuf,
}

/// `D/up.json`: what the supervisor runs, rewritten on every change.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub supervisor_pid: u32,
    pub started_at: jiff::Timestamp,
    /// False once the supervisor has stopped everything and exited.
    pub running: bool,
    pub node_name: String,
    /// `--join`: this machine runs only runtime and agent.
    pub join: bool,
    /// The kubeconfig `berth status` reaches the API with (admin, or the node's on a worker).
    pub kubeconfig: PathBuf,
    pub runtime_socket: PathBuf,
    pub agent_port: u16,
    /// Whether the node has been seen Ready since this supervisor started it.
    pub node_ready: bool,
    pub parts: Vec<PartStatus>,
    pub runtimes: Vec<Probe>,
}

impl State {
    pub fn read(layout: &Layout) -> Option<State> {
        let text = std::fs::read(layout.state_file()).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Written aside and renamed, so a reader never sees half of it.
    pub fn write(&self, layout: &Layout) -> std::io::Result<()> {
        write_atomically(&layout.state_file(), &serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?)
    }
}

/// Writes `path` through a temp file beside it and a rename.
pub fn write_atomically(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let mut file = File::create(&tmp)?;
    file.write_all(data)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The supervisor's hold on a data dir: an exclusive flock on `D/up.lock`, released when the
/// process ends however it ends.
pub struct Lock {
    _file: File,
}

impl Lock {
    /// `None` when another process holds it.
    pub fn try_acquire(layout: &Layout) -> anyhow::Result<Option<Lock>> {
        let path = layout.lockfile();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(Lock { _file: file })),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot lock {}", path.display())),
        }
    }
}

/// The pid of the supervisor of `layout` if one is alive: the lock is held, and the pidfile
/// names a live `berth up --foreground` process.
pub fn live_supervisor(layout: &Layout) -> Option<u32> {
    if !layout.lockfile().exists() {
        return None;
    }
    // Taking the lock ourselves means nobody holds it; it is released at once.
    if Lock::try_acquire(layout).ok()?.is_some() {
        return None;
    }
    let pid: u32 = std::fs::read_to_string(layout.pidfile()).ok()?.trim().parse().ok()?;
    is_supervisor(pid).then_some(pid)
}

/// Whether `pid` is a live `berth up --foreground` (the supervisor), not a recycled pid.
pub fn is_supervisor(pid: u32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    process_alive(pid) && args.contains(&b"up".as_slice()) && args.contains(&b"--foreground".as_slice())
}

/// Whether a process with this pid exists (zombies excluded).
pub fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// The last `lines` lines of a log file, for error messages.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `1h2m`, `3m4s`, `5s`: an uptime as `kubectl get` prints ages.
pub fn human_duration(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86400 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_data_dir_owns_the_berth_table_and_any_other_one_a_table_of_its_own() {
        assert_eq!(Layout::new(Path::new(DEFAULT_DATA_DIR)).unwrap().proxy_table(), "berth");
        let a = Layout::new(Path::new("/tmp/a")).unwrap().proxy_table();
        assert!(a.starts_with("berth-") && a.len() == 14, "{a}");
        assert_ne!(a, Layout::new(Path::new("/tmp/b")).unwrap().proxy_table());
    }

    #[test]
    fn durations_read_as_kubectl_ages() {
        use std::time::Duration;
        assert_eq!(human_duration(Duration::from_secs(5)), "5s");
        assert_eq!(human_duration(Duration::from_secs(185)), "3m5s");
        assert_eq!(human_duration(Duration::from_secs(7300)), "2h1m");
        assert_eq!(human_duration(Duration::from_secs(90000)), "1d1h");
    }

    #[test]
    fn a_second_lock_on_a_data_dir_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path()).unwrap();
        let first = Lock::try_acquire(&layout).unwrap();
        assert!(first.is_some());
        assert!(Lock::try_acquire(&layout).unwrap().is_none());
        drop(first);
        assert!(Lock::try_acquire(&layout).unwrap().is_some());
    }

    #[test]
    fn no_supervisor_is_alive_without_the_lock_held() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path()).unwrap();
        std::fs::write(layout.pidfile(), std::process::id().to_string()).unwrap();
        assert_eq!(live_supervisor(&layout), None);
        let _held = Lock::try_acquire(&layout).unwrap();
        // The pid is alive but is a test binary, not `berth up --foreground`.
        assert_eq!(live_supervisor(&layout), None);
    }

    #[test]
    fn the_default_data_dir_needs_no_flag() {
        assert_eq!(Layout::new(Path::new(DEFAULT_DATA_DIR)).unwrap().flag(), "");
        assert_eq!(Layout::new(Path::new("/srv/b")).unwrap().flag(), " --data-dir /srv/b");
    }
}
