//! Named persistent network namespaces (the crate's only kernel-facing module), behind [`NetnsOps`].
//!
//! A namespace is kept alive the way `ip netns add` keeps it: a short-lived thread unshares its
//! network namespace and bind-mounts `/proc/self/task/<tid>/ns/net` onto `<dir>/<name>`. The
//! directory is made a shared mount point first (bind-mounted onto itself when it is not a mount
//! point yet), so that removing a namespace also releases the copies of its mount that other
//! mount namespaces created since then would otherwise keep alive.
//!
//! [`KernelNetns`] is the real implementation; [`RecordingNetns`] is a fake that records calls, for
//! the tests of the logic around it.

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};

/// Where berth keeps its named network namespaces (iproute2 uses `/run/netns`).
pub const DEFAULT_NETNS_DIR: &str = "/run/berth/netns";

/// Errors of namespace management.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The name cannot be a file name in the namespace directory.
    #[error("invalid network namespace name {name:?}: must be a non-empty file name without '/'")]
    InvalidName { name: String },
    /// A namespace (or some other file) already has that name.
    #[error("network namespace {path:?} already exists")]
    AlreadyExists { path: PathBuf },
    /// A step of creating or deleting a namespace failed in the kernel.
    #[error("network namespace {path:?}: {step} failed")]
    Kernel {
        path: PathBuf,
        step: &'static str,
        #[source]
        source: io::Error,
    },
}

/// Create, delete and look up named network namespaces.
pub trait NetnsOps: Send + Sync {
    /// The path a namespace of that name has (whether or not it exists).
    fn path(&self, name: &str) -> PathBuf;
    /// Creates a new, empty network namespace and returns its path.
    fn create(&self, name: &str) -> Result<PathBuf, NetnsError>;
    /// Deletes the namespace; a namespace that does not exist is not an error.
    fn delete(&self, name: &str) -> Result<(), NetnsError>;
    /// Whether a namespace of that name exists.
    fn exists(&self, name: &str) -> bool;
}

fn check_name(name: &str) -> Result<(), NetnsError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(NetnsError::InvalidName { name: name.to_owned() });
    }
    Ok(())
}

/// Network namespaces in the kernel, bind-mounted under a directory.
#[derive(Debug)]
pub struct KernelNetns {
    dir: PathBuf,
    /// Set once the directory exists and is a shared mount point.
    dir_ready: OnceLock<()>,
}

impl Default for KernelNetns {
    fn default() -> Self {
        Self::new(DEFAULT_NETNS_DIR)
    }
}

impl KernelNetns {
    /// Namespaces under `dir`, which is created (and made a shared mount point) on first use.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into(), dir_ready: OnceLock::new() }
    }

    /// The directory holding the namespace files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn kernel(&self, path: &Path, step: &'static str) -> impl FnOnce(Errno) -> NetnsError {
        let path = path.to_owned();
        move |errno| NetnsError::Kernel { path, step, source: io::Error::from(errno) }
    }

    /// Creates the directory and makes it a shared mount point, as `ip netns add` does.
    fn prepare_dir(&self) -> Result<(), NetnsError> {
        if self.dir_ready.get().is_some() {
            return Ok(());
        }
        let dir = &self.dir;
        std::fs::create_dir_all(dir).map_err(|source| NetnsError::Kernel {
            path: dir.clone(),
            step: "creating the namespace directory",
            source,
        })?;
        let shared = MsFlags::MS_SHARED | MsFlags::MS_REC;
        let none: Option<&str> = None;
        match nix::mount::mount(none, dir, none, shared, none) {
            Ok(()) => {}
            // Not a mount point yet: make it one by binding it onto itself, then share it.
            Err(Errno::EINVAL) => {
                nix::mount::mount(Some(dir), dir, none, MsFlags::MS_BIND | MsFlags::MS_REC, none)
                    .map_err(self.kernel(dir, "bind-mounting the namespace directory onto itself"))?;
                nix::mount::mount(none, dir, none, shared, none)
                    .map_err(self.kernel(dir, "making the namespace directory a shared mount"))?;
            }
            Err(errno) => return Err(self.kernel(dir, "making the namespace directory a shared mount")(errno)),
        }
        let _ = self.dir_ready.set(());
        Ok(())
    }
}

/// Whether `path` is a mounted network namespace (an nsfs file), as opposed to a missing path or
/// a leftover mount point whose namespace is gone.
pub fn is_netns_mount(path: &Path) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
}

impl NetnsOps for KernelNetns {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn create(&self, name: &str) -> Result<PathBuf, NetnsError> {
        check_name(name)?;
        self.prepare_dir()?;
        let path = self.path(name);
        // The mount point: an empty file, created exclusively so two creators cannot share it.
        match OpenOptions::new().write(true).create_new(true).mode(0o000).open(&path) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(NetnsError::AlreadyExists { path }),
            Err(source) => return Err(NetnsError::Kernel { path, step: "creating the mount point", source }),
        }
        // Only the unsharing thread moves to the new namespace; it ends right after the bind mount.
        let target = path.clone();
        let mounted = std::thread::spawn(move || -> Result<(), (&'static str, Errno)> {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| ("unsharing the network namespace", e))?;
            let own = format!("/proc/self/task/{}/ns/net", nix::unistd::gettid());
            let none: Option<&str> = None;
            nix::mount::mount(Some(own.as_str()), &target, none, MsFlags::MS_BIND, none)
                .map_err(|e| ("bind-mounting the namespace", e))
        })
        .join()
        .unwrap_or(Err(("unsharing the network namespace", Errno::EIO)));
        if let Err((step, errno)) = mounted {
            let _ = std::fs::remove_file(&path);
            return Err(self.kernel(&path, step)(errno));
        }
        tracing::debug!(netns = %path.display(), "created network namespace");
        Ok(path)
    }

    fn delete(&self, name: &str) -> Result<(), NetnsError> {
        check_name(name)?;
        let path = self.path(name);
        match nix::mount::umount2(&path, MntFlags::MNT_DETACH) {
            // EINVAL: not a mount point (a half-created or already unmounted namespace).
            Ok(()) | Err(Errno::ENOENT) | Err(Errno::EINVAL) => {}
            Err(errno) => return Err(self.kernel(&path, "unmounting the namespace")(errno)),
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(NetnsError::Kernel { path, step: "removing the mount point", source }),
        }
        tracing::debug!(netns = %path.display(), "deleted network namespace");
        Ok(())
    }

    fn exists(&self, name: &str) -> bool {
        check_name(name).is_ok() && is_netns_mount(&self.path(name))
    }
}

/// One call made to a [`RecordingNetns`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetnsCall {
    Create(String),
    Delete(String),
}

/// A fake [`NetnsOps`] that records calls and keeps its namespaces in memory.
#[derive(Debug, Default)]
pub struct RecordingNetns {
    dir: PathBuf,
    calls: Mutex<Vec<NetnsCall>>,
    present: Mutex<BTreeSet<String>>,
    fail_create: bool,
}

impl RecordingNetns {
    /// A fake whose namespace paths are under `dir` (nothing is created there).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into(), ..Self::default() }
    }

    /// A fake whose `create` always fails.
    pub fn failing_create(dir: impl Into<PathBuf>) -> Self {
        Self { fail_create: true, ..Self::new(dir) }
    }

    /// The calls made so far, in order.
    pub fn calls(&self) -> Vec<NetnsCall> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn record(&self, call: NetnsCall) {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).push(call);
    }

    fn present(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.present.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl NetnsOps for RecordingNetns {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn create(&self, name: &str) -> Result<PathBuf, NetnsError> {
        check_name(name)?;
        self.record(NetnsCall::Create(name.to_owned()));
        let path = self.path(name);
        if self.fail_create {
            let source = io::Error::from(io::ErrorKind::PermissionDenied);
            return Err(NetnsError::Kernel { path, step: "unsharing the network namespace", source });
        }
        if !self.present().insert(name.to_owned()) {
            return Err(NetnsError::AlreadyExists { path });
        }
        Ok(path)
    }

    fn delete(&self, name: &str) -> Result<(), NetnsError> {
        check_name(name)?;
        self.record(NetnsCall::Delete(name.to_owned()));
        self.present().remove(name);
        Ok(())
    }

    fn exists(&self, name: &str) -> bool {
        self.present().contains(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_not_plain_file_names_are_rejected() {
        for bad in ["", ".", "..", "a/b", "/abs"] {
            assert!(matches!(check_name(bad), Err(NetnsError::InvalidName { .. })), "{bad:?}");
        }
        assert!(check_name("0123abcd-pod").is_ok());
    }

    #[test]
    fn the_fake_records_calls_and_tracks_existence() {
        let fake = RecordingNetns::new("/run/test");
        assert_eq!(fake.create("a").unwrap(), PathBuf::from("/run/test/a"));
        assert!(fake.exists("a"));
        assert!(matches!(fake.create("a"), Err(NetnsError::AlreadyExists { .. })));
        fake.delete("a").unwrap();
        fake.delete("a").unwrap();
        assert!(!fake.exists("a"));
        let create = NetnsCall::Create("a".into());
        let delete = NetnsCall::Delete("a".into());
        assert_eq!(fake.calls(), vec![create.clone(), create, delete.clone(), delete]);
    }
}
