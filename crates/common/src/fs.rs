//! Files replaced whole, never readable with a wider mode than asked for: keys, tokens, kubeconfigs.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A failed step of [`write_atomic`]: the step, the file it failed on, and the cause.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {}", path.display())]
pub struct WriteError {
    /// `create`, `set permissions on`, `write`, `sync` or `rename into`.
    pub action: &'static str,
    /// The temporary file, or `path` itself for `rename into`.
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// Replaces `path` with `contents` with mode `mode`, for credentials and keys (mode 0600) and the
/// certificates beside them.
///
/// The data goes to a temporary file beside `path` (`.<name>.<pid>.tmp`) that has `mode` from its
/// creation, is synced, then renamed over `path`: a crash leaves the old file or the whole new
/// one, never a torn key, and the data is never readable with a wider mode. A failed write
/// removes the temporary file. The directory is not synced; a caller that needs the rename itself
/// to survive a host crash syncs it.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), WriteError> {
    let mut tmp_name = OsString::from(".");
    tmp_name.push(path.file_name().unwrap_or_default());
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let written = write_and_rename(&tmp, path, contents, mode);
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

fn write_and_rename(tmp: &Path, path: &Path, contents: &[u8], mode: u32) -> Result<(), WriteError> {
    let err = |action, path: &Path| {
        let path = path.to_path_buf();
        move |source| WriteError { action, path, source }
    };
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(tmp)
        .map_err(err("create", tmp))?;
    // `mode` only applies to newly created files; a leftover temporary file keeps its old mode.
    file.set_permissions(fs::Permissions::from_mode(mode)).map_err(err("set permissions on", tmp))?;
    file.write_all(contents).map_err(err("write", tmp))?;
    file.sync_all().map_err(err("sync", tmp))?;
    fs::rename(tmp, path).map_err(err("rename into", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_file_is_replaced_with_the_asked_mode_and_no_temporary_file_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin.token");
        fs::write(&path, "old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        write_atomic(&path, b"new\n", 0o600).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new\n");
        assert_eq!(mode(&path), 0o600);
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["admin.token"]);
    }

    #[test]
    fn a_leftover_temporary_file_with_a_wider_mode_is_tightened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.key");
        let tmp = dir.path().join(format!(".ca.key.{}.tmp", std::process::id()));
        fs::write(&tmp, "stale").unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o666)).unwrap();
        write_atomic(&path, b"key", 0o600).unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(fs::read_to_string(&path).unwrap(), "key");
    }

    #[test]
    fn a_failed_step_is_named_with_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("node.kubeconfig");
        let e = write_atomic(&path, b"x", 0o600).unwrap_err();
        assert_eq!(e.action, "create");
        assert!(e.to_string().starts_with("cannot create "), "{e}");
        assert_eq!(e.source.kind(), io::ErrorKind::NotFound);
    }
}
