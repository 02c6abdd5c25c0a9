//! `exit.json`, the record of how a container's init exited, and the atomic writes of the small
//! files in a monitor's state dir.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::EXIT_FILE;

/// How a container's init process ended, as the monitor recorded it in `exit.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerExit {
    /// The exit code; `128 + signal` when a signal killed it (137 for SIGKILL), as shells and
    /// containerd report it.
    pub exit_code: i32,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
    /// When the monitor reaped it, RFC 3339 with nanoseconds in UTC.
    pub finished_at: String,
    /// Whether the kernel's OOM killer killed a process of the container's memory cgroup while the
    /// monitor watched it (false when the cgroup could not be found).
    pub oom_killed: bool,
}

/// Failures reading or writing the state dir's files.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("reading {path}")]
    Read { path: PathBuf, source: io::Error },
    #[error("parsing {path}")]
    Parse { path: PathBuf, source: serde_json::Error },
    #[error("writing {path}")]
    Write { path: PathBuf, source: io::Error },
}

/// The container's exit recorded in `state_dir`, or `None` while it has not exited (or its
/// monitor died before it did).
pub fn read_exit(state_dir: &Path) -> Result<Option<ContainerExit>, StatusError> {
    let path = state_dir.join(EXIT_FILE);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(StatusError::Read { path, source }),
    };
    serde_json::from_slice(&bytes).map(Some).map_err(|source| StatusError::Parse { path, source })
}

/// Records `exit` in `state_dir` so that readers see the whole file or none.
pub fn write_exit(state_dir: &Path, exit: &ContainerExit) -> Result<(), StatusError> {
    let json = serde_json::to_vec(exit).expect("an exit record serializes");
    write_atomic(&state_dir.join(EXIT_FILE), &json, Durability::Synced)
}

/// Whether [`write_atomic`] waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync before the rename: the file survives a host crash whole or not at all.
    Synced,
    /// No fsync (it can cost milliseconds): for files that mean nothing after a host crash.
    Unsynced,
}

/// Writes `bytes` to a temporary sibling of `path` and renames it over `path`, so that readers
/// see the old file or the new one, never a part.
pub fn write_atomic(path: &Path, bytes: &[u8], durability: Durability) -> Result<(), StatusError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let result = (|| {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        if durability == Durability::Synced {
            file.sync_all()?;
        }
        fs::rename(&tmp, path)
    })();
    result.map_err(|source| {
        let _ = fs::remove_file(&tmp);
        StatusError::Write { path: path.to_path_buf(), source }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_exit_reads_back_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let exit = ContainerExit {
            exit_code: 137,
            signal: Some(9),
            finished_at: "2025-01-01T00:00:00.000000001Z".into(),
            oom_killed: true,
        };
        write_exit(dir.path(), &exit).unwrap();
        assert_eq!(read_exit(dir.path()).unwrap(), Some(exit));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file is left");
    }

    #[test]
    fn a_missing_exit_file_means_not_exited_yet() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_exit(dir.path()).unwrap(), None);
    }

    #[test]
    fn the_exit_file_has_the_documented_field_names() {
        let exit = ContainerExit { exit_code: 3, signal: None, finished_at: "t".into(), oom_killed: false };
        assert_eq!(
            serde_json::to_string(&exit).unwrap(),
            r#"{"exit_code":3,"signal":null,"finished_at":"t","oom_killed":false}"#
        );
    }

    #[test]
    fn a_corrupt_exit_file_is_a_parse_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(EXIT_FILE), b"{").unwrap();
        let err = read_exit(dir.path()).unwrap_err();
        assert!(matches!(err, StatusError::Parse { .. }) && err.to_string().contains(EXIT_FILE), "{err}");
    }
}
