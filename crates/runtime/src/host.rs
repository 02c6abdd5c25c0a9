//! The runtime's one module that touches the kernel directly (besides the OCI runtimes, the CNI
//! plugins and the monitors it runs): container root filesystems on overlayfs, the pod's `/dev/shm`
//! tmpfs, the pod's infra process, and waiting for processes that are not the runtime's children.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::io::AsyncBufReadExt;
use tokio::io::unix::AsyncFd;

/// Mounts an overlay of `lower` (lowest layer first, as the image store lists them) with the
/// container's writable `upper` and overlayfs' `work` dir at `target`. An image without layers
/// gets an empty lower dir.
pub fn mount_overlay(lower: &[PathBuf], upper: &Path, work: &Path, target: &Path) -> io::Result<()> {
    for dir in [upper, work, target] {
        std::fs::create_dir_all(dir)?;
    }
    let empty;
    let lower: Vec<&Path> = if lower.is_empty() {
        empty = upper.with_file_name("empty");
        std::fs::create_dir_all(&empty)?;
        vec![empty.as_path()]
    } else {
        // overlayfs lists the top layer first.
        lower.iter().rev().map(PathBuf::as_path).collect()
    };
    let lowerdir = lower.iter().map(|p| p.to_string_lossy()).collect::<Vec<_>>().join(":");
    // `volatile`: overlayfs skips syncing the upper filesystem, above all on unmount, where it
    // would otherwise sync the whole host filesystem (5–10 ms per container here). A writable
    // layer need not outlive a host crash: no container does.
    let options = format!("lowerdir={lowerdir},upperdir={},workdir={},volatile", upper.display(), work.display());
    nix::mount::mount(Some("overlay"), target, Some("overlay"), MsFlags::empty(), Some(options.as_str()))
        .map_err(|e| with_context(e, format!("mounting the overlay rootfs at {}", target.display())))
}

/// Mounts a tmpfs at `target` (created if missing) with `options` (e.g. `size=65536k,mode=1777`).
pub fn mount_tmpfs(target: &Path, options: &str) -> io::Result<()> {
    std::fs::create_dir_all(target)?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    nix::mount::mount(Some("shm"), target, Some("tmpfs"), flags, Some(options))
        .map_err(|e| with_context(e, format!("mounting tmpfs at {}", target.display())))
}

/// Unmounts `target` (lazily, so a process still inside cannot block it), and again while
/// something is still mounted there (mounts stacked on one path, as propagation can leave); a
/// path that is missing or not a mount point is fine: unmount is part of idempotent teardowns.
pub fn unmount(target: &Path) -> io::Result<()> {
    const MAX_STACKED: usize = 16;
    for _ in 0..MAX_STACKED {
        match nix::mount::umount2(target, MntFlags::MNT_DETACH) {
            Ok(()) => {}
            Err(Errno::EINVAL) | Err(Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(with_context(e, format!("unmounting {}", target.display()))),
        }
    }
    Err(io::Error::other(format!("unmounting {}: still mounted after {MAX_STACKED} unmounts", target.display())))
}

fn with_context(e: Errno, what: String) -> io::Error {
    io::Error::new(io::Error::from(e).kind(), format!("{what}: {e}"))
}

/// Which namespaces a pod's infra process creates for the pod's containers to share.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InfraOptions {
    pub pid: bool,
    pub ipc: bool,
    pub uts: bool,
    /// Set in the new UTS namespace.
    pub hostname: Option<String>,
}

impl InfraOptions {
    /// Whether the pod needs an infra process at all.
    pub fn needed(&self) -> bool {
        self.pid || self.ipc || self.uts
    }
}

/// Starts the pod's infra process, `unshare --fork … berth-monitor pause`, in its own process
/// group so that signals meant for the runtime do not reach it. Returns its pid on the host once
/// it has set the pod up. The `unshare` parent is reaped by a background task while the runtime
/// lives (after a restart, init reaps it).
pub async fn spawn_infra(monitor_binary: &Path, options: &InfraOptions) -> io::Result<i32> {
    let mut command = tokio::process::Command::new("unshare");
    command.arg("--fork").arg("--kill-child");
    if options.pid {
        command.arg("--pid");
    }
    if options.ipc {
        command.arg("--ipc");
    }
    if options.uts {
        command.arg("--uts");
    }
    command.arg("--").arg(monitor_binary).arg("pause");
    if let Some(hostname) = options.hostname.as_deref().filter(|_| options.uts) {
        command.arg("--hostname").arg(hostname);
    }
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let mut child = command.spawn().map_err(|e| io::Error::new(e.kind(), format!("starting unshare: {e}")))?;
    let stdout = child.stdout.take().expect("piped");
    let mut line = String::new();
    let read = tokio::io::BufReader::new(stdout).read_line(&mut line).await;
    let pid = read.ok().and_then(|_| line.trim().parse::<i32>().ok()).filter(|p| *p > 0);
    let Some(pid) = pid else {
        let output = child.wait_with_output().await?;
        return Err(io::Error::other(format!(
            "the infra process did not start ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    };
    tokio::spawn(async move {
        let _ = child.wait().await;
    });
    Ok(pid)
}

/// Sends `signal` to `pid`; a process that is already gone is fine.
pub fn kill(pid: i32, signal: Signal) -> io::Result<()> {
    match nix::sys::signal::kill(Pid::from_raw(pid), signal) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Waits until process `pid` exits (any process: a pidfd, not `waitpid`). Returns at once when
/// there is no such process.
pub async fn wait_for_exit(pid: i32) -> io::Result<()> {
    let Some(pid) = rustix::process::Pid::from_raw(pid) else { return Ok(()) };
    let fd = match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::NONBLOCK) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::SRCH) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    // A pidfd becomes readable when its process has terminated. tokio deprecates this safe
    // constructor because a borrowed fd could be closed while registered; AsyncFd owns this one.
    #[allow(deprecated)]
    let fd = AsyncFd::new(fd)?;
    let _ready = fd.readable().await?;
    Ok(())
}

/// The namespace file of `kind` (`net`, `pid`, `ipc`, `uts`) of process `pid`.
pub fn namespace_path(pid: i32, kind: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/ns/{kind}"))
}

/// Whether `path` is a mount point (its device differs from its parent's), for leak checks.
pub fn is_mounted(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(meta), Some(parent)) = (std::fs::symlink_metadata(path), path.parent()) else { return false };
    std::fs::metadata(parent).is_ok_and(|p| p.dev() != meta.dev())
}

/// Removes cgroup `path` (relative to each hierarchy's root) from every mounted hierarchy, v1 and
/// v2; a cgroup that is missing or still has members is left (rmdir refuses it).
pub fn remove_cgroup(path: &str) {
    let rel = path.trim_start_matches('/');
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else { return };
    let mut dirs: Vec<PathBuf> = hierarchies.flatten().map(|h| h.path().join(rel)).collect();
    dirs.push(Path::new("/sys/fs/cgroup").join(rel));
    for dir in dirs {
        match std::fs::remove_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(Errno::ENOTDIR as i32) => {}
            Err(e) => tracing::debug!(cgroup = %dir.display(), error = %e, "cgroup not removed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mounted(path: &Path) -> bool {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let path = path.to_str().unwrap();
        mountinfo.lines().any(|l| l.split(' ').nth(4) == Some(path))
    }

    #[test]
    fn unmounting_removes_every_mount_stacked_on_the_path_and_then_is_a_no_op() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().canonicalize().unwrap();
        for _ in 0..2 {
            nix::mount::mount(Some("tmpfs"), &target, Some("tmpfs"), nix::mount::MsFlags::empty(), None::<&str>)
                .unwrap();
        }
        assert!(mounted(&target));
        unmount(&target).unwrap();
        assert!(!mounted(&target), "a mount is left on {}", target.display());
        unmount(&target).unwrap();
        unmount(&target.join("missing")).unwrap();
    }
}
