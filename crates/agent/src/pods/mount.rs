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

/// Lazily unmounts everything mounted at or below `dir`, deepest first; returns how many. For
/// the volumes a stopped agent leaves mounted under its root dir when its pods are removed
/// through CRI rather than by the agent (`berth down --stop-pods`).
pub fn unmount_all_under(dir: &Path) -> std::io::Result<usize> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut unmounted = 0;
    for target in mounts_under(&mountinfo, dir) {
        match nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH) {
            Ok(()) => unmounted += 1,
            // Gone with a parent's lazy unmount.
            Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(std::io::Error::other(format!("unmounting {}: {e}", target.display()))),
        }
    }
    Ok(unmounted)
}

/// The mount points at or below `dir` in a `/proc/self/mountinfo` text, deepest first.
fn mounts_under(mountinfo: &str, dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found: Vec<std::path::PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| std::path::PathBuf::from(unescape_octal(field)))
        .filter(|target| target.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// mountinfo writes space, tab, newline and backslash in paths as `\NNN` (octal).
fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let code = bytes
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match (bytes[i], code) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
90 22 0:50 / /var/lib/berth/agent/pods/u1/volumes/kubernetes.io~projected/kube-api-access-x rw - tmpfs tmpfs rw
91 22 0:51 / /var/lib/berth/agent/pods/u2/volumes/kubernetes.io~secret/my\\040secret rw - tmpfs tmpfs rw
92 91 0:52 / /var/lib/berth/agent/pods/u2/volumes/kubernetes.io~secret/my\\040secret/inner rw - tmpfs tmpfs rw
93 22 0:53 / /var/lib/berth/agent-other/pods/u3 rw - tmpfs tmpfs rw
";

    #[test]
    fn the_mounts_under_a_directory_come_deepest_first_with_their_escapes_decoded() {
        let found = mounts_under(MOUNTINFO, Path::new("/var/lib/berth/agent"));
        let secret = "/var/lib/berth/agent/pods/u2/volumes/kubernetes.io~secret/my secret";
        assert_eq!(
            found,
            vec![
                std::path::PathBuf::from(format!("{secret}/inner")),
                "/var/lib/berth/agent/pods/u1/volumes/kubernetes.io~projected/kube-api-access-x".into(),
                secret.into(),
            ]
        );
    }

    #[test]
    fn a_sibling_directory_with_the_same_prefix_is_not_under_it() {
        let found = mounts_under(MOUNTINFO, Path::new("/var/lib/berth/agent"));
        assert!(found.iter().all(|p| !p.starts_with("/var/lib/berth/agent-other")), "{found:?}");
    }
}
