//! The only place the pod workers touch the kernel: tmpfs mounts for memory-backed volumes and
//! the disk usage of a filesystem, behind [`Mounter`] so that volume logic is testable without root.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Mounts and unmounts tmpfs volumes.
pub trait Mounter: Send + Sync + std::fmt::Debug {
    /// A tmpfs of at most `size` bytes (the kernel's default, half of RAM, when `None`) at `target`.
    fn mount_tmpfs(&self, target: &Path, size: Option<u64>) -> std::io::Result<()>;
    /// Lazily unmounts `target`.
    fn unmount(&self, target: &Path) -> std::io::Result<()>;
    /// Whether a filesystem other than its parent's is mounted at `target`.
    fn is_mounted(&self, target: &Path) -> bool;
}

/// The real thing: mount(2) and umount2(2).
#[derive(Debug, Default)]
pub struct HostMounter;

impl Mounter for HostMounter {
    fn mount_tmpfs(&self, target: &Path, size: Option<u64>) -> std::io::Result<()> {
        use nix::mount::{MsFlags, mount};
        let options = match size {
            Some(bytes) => format!("mode=0777,size={bytes}"),
            None => "mode=0777".to_string(),
        };
        mount(Some("tmpfs"), target, Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some(options.as_str()))
            .map_err(std::io::Error::from)
    }

    fn unmount(&self, target: &Path) -> std::io::Result<()> {
        nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH).map_err(std::io::Error::from)
    }

    fn is_mounted(&self, target: &Path) -> bool {
        let (Ok(me), Some(Ok(parent))) = (target.metadata(), target.parent().map(Path::metadata)) else {
            return false;
        };
        me.dev() != parent.dev()
    }
}

/// Capacity and available bytes of the filesystem holding `path` (statvfs).
pub fn filesystem_usage(path: &Path) -> std::io::Result<super::images::FsUsage> {
    let s = nix::sys::statvfs::statvfs(path).map_err(std::io::Error::from)?;
    let frag = s.fragment_size() as u64;
    Ok(super::images::FsUsage {
        capacity: (s.blocks() as u64).saturating_mul(frag),
        available: (s.blocks_available() as u64).saturating_mul(frag),
    })
}

/// A mounter that only records, for unit tests of volume logic.
#[cfg(test)]
#[derive(Debug, Default)]
pub struct RecordingMounter {
    pub mounted: std::sync::Mutex<Vec<(std::path::PathBuf, Option<u64>)>>,
}

#[cfg(test)]
impl Mounter for RecordingMounter {
    fn mount_tmpfs(&self, target: &Path, size: Option<u64>) -> std::io::Result<()> {
        self.mounted.lock().unwrap().push((target.to_path_buf(), size));
        Ok(())
    }
    fn unmount(&self, target: &Path) -> std::io::Result<()> {
        self.mounted.lock().unwrap().retain(|(p, _)| p != target);
        Ok(())
    }
    fn is_mounted(&self, target: &Path) -> bool {
        self.mounted.lock().unwrap().iter().any(|(p, _)| p == target)
    }
}
