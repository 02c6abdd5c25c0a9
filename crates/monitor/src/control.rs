//! Talking to a running monitor from the runtime: is it alive, where is it, reopen its log.
//!
//! A pid alone can be reused, so every call first checks that the process is a live (not zombie)
//! process named `berth-monitor` before signalling it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::{MONITOR_NAME, MONITOR_PID_FILE};

/// Failures controlling a monitor.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("no monitor runs as pid {pid}")]
    NotRunning { pid: i32 },
    #[error("signalling monitor {pid}")]
    Signal { pid: i32, source: nix::Error },
    #[error("reading {path}")]
    PidFile { path: PathBuf, source: io::Error },
    #[error("writing {path}")]
    Winsize { path: PathBuf, source: crate::status::StatusError },
}

/// Whether `pid` is a running `berth-monitor` (not a zombie, not a process that reused the pid).
pub fn is_alive(monitor_pid: i32) -> bool {
    proc_stat(monitor_pid).is_some_and(|s| s.comm == MONITOR_NAME && !matches!(s.state, 'Z' | 'X' | 'x'))
}

/// What `/proc/<pid>/stat` says of a process that exists (a zombie too).
pub(crate) struct ProcStat {
    pub comm: String,
    pub state: char,
    pub ppid: i32,
}

pub(crate) fn proc_stat(pid: i32) -> Option<ProcStat> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "<pid> (<comm>) <state> <ppid> ...": comm may hold spaces and parentheses, so split at the last ')'.
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let mut rest = stat.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some(ProcStat { comm: stat.get(open + 1..close)?.to_string(), state, ppid })
}

/// The pid the monitor of `state_dir` recorded, `None` if it never started or has exited
/// cleanly (it removes the file only when `create` failed; check [`is_alive`] too).
pub fn read_monitor_pid(state_dir: &Path) -> Result<Option<i32>, ControlError> {
    let path = state_dir.join(MONITOR_PID_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => Ok(text.trim().parse().ok()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ControlError::PidFile { path, source }),
    }
}

/// Asks the monitor to close and reopen its log file (CRI `ReopenContainerLog`, after the log was
/// renamed away). Asynchronous: the monitor reopens within its next loop turn, creating a new file
/// at the log path.
pub fn reopen_log(monitor_pid: i32) -> Result<(), ControlError> {
    if !is_alive(monitor_pid) {
        return Err(ControlError::NotRunning { pid: monitor_pid });
    }
    kill(Pid::from_raw(monitor_pid), Signal::SIGUSR1)
        .map_err(|source| ControlError::Signal { pid: monitor_pid, source })
}

/// Asks the monitor of `state_dir` to set its container's terminal to `cols`×`rows` (a
/// container with a terminal; others ignore it).
pub fn resize(state_dir: &Path, monitor_pid: i32, cols: u16, rows: u16) -> Result<(), ControlError> {
    if !is_alive(monitor_pid) {
        return Err(ControlError::NotRunning { pid: monitor_pid });
    }
    let path = state_dir.join(crate::console::WINSIZE_FILE);
    crate::status::write_atomic(&path, format!("{cols} {rows}\n").as_bytes(), crate::status::Durability::Unsynced)
        .map_err(|source| ControlError::Winsize { path, source })?;
    kill(Pid::from_raw(monitor_pid), Signal::SIGWINCH)
        .map_err(|source| ControlError::Signal { pid: monitor_pid, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_with_another_name_is_not_a_live_monitor() {
        assert!(!is_alive(std::process::id() as i32));
        assert!(!is_alive(i32::MAX));
    }

    #[test]
    fn reopening_the_log_of_no_monitor_fails_without_signalling_anything() {
        let err = reopen_log(std::process::id() as i32).unwrap_err();
        assert!(matches!(err, ControlError::NotRunning { .. }), "{err}");
    }

    #[test]
    fn the_monitor_pid_is_read_from_the_state_dir() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_monitor_pid(dir.path()).unwrap(), None);
        fs::write(dir.path().join(MONITOR_PID_FILE), "1234\n").unwrap();
        assert_eq!(read_monitor_pid(dir.path()).unwrap(), Some(1234));
    }
}
