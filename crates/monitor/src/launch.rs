//! Starting a monitor from the runtime: spawn `berth-monitor`, wait for its one report, and turn
//! it into a [`MonitorHandle`] or a [`MonitorError`].
//!
//! Blocking (it waits for the OCI runtime's `create`): call it from `spawn_blocking`. The monitor
//! detaches itself (a second stage in a new session, reparented away from the caller), so the
//! caller never has to reap it and may die at any time after `launch` returns.

use std::ffi::OsString;
use std::io::{self, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::args::MonitorArgs;
use crate::report::Report;

/// What to monitor and how.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// The `berth-monitor` binary (the runtime finds it next to its own executable).
    pub monitor_binary: PathBuf,
    /// The container id.
    pub id: String,
    /// The monitor's directory for `monitor.pid` and `exit.json`; created if missing.
    pub state_dir: PathBuf,
    /// The CRI log file; `None` discards the output.
    pub log_path: Option<PathBuf>,
    /// The pid file that `create_command` writes (`--pid-file` of the OCI runtime).
    pub pid_file: PathBuf,
    /// The OCI runtime's create command, program first; absolute paths.
    pub create_command: Vec<OsString>,
    /// Give the container a stdin pipe for attach clients to write to (CRI `stdin`); without it
    /// the container's stdin is /dev/null.
    pub stdin: bool,
    /// Close the container's stdin when the first attach client's input ends (CRI `stdin_once`;
    /// only with `stdin`).
    pub stdin_once: bool,
    /// Serve the attach protocol ([`crate::attach`]) on a unix socket here, from before `create`
    /// until the container exits. A short absolute path (`sun_path` holds 107 bytes), such as
    /// `/run/berth/attach/<id>.sock`; the parent dir is created.
    pub attach_socket: Option<PathBuf>,
    /// For a container with a terminal: where the OCI runtime sends the pty master (the create
    /// command must name the same path as its `--console-socket`). A short absolute path.
    pub console_socket: Option<PathBuf>,
}

/// A running monitor and the container it watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MonitorHandle {
    pub monitor_pid: i32,
    pub container_pid: i32,
}

/// Why a monitor did not start watching a container.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    #[error("starting monitor {binary}")]
    Spawn { binary: PathBuf, source: io::Error },
    #[error("reading the monitor's report")]
    Report { source: io::Error },
    /// The OCI runtime's create failed; the monitor has exited.
    #[error("container create failed (exit code {exit_code:?}): {stderr}")]
    CreateFailed { exit_code: Option<i32>, stderr: String },
    /// The monitor failed before a container existed (bad arguments, state dir, log file).
    #[error("monitor setup failed: {message}")]
    Setup { message: String },
    /// The monitor exited without a report (it crashed); `output` is what it printed.
    #[error("monitor exited without a report: {output}")]
    NoReport { output: String },
}

/// Starts a monitor that runs `create_command` and watches the container it creates. Returns once
/// the container is created (or creating it failed).
pub fn launch(options: &LaunchOptions) -> Result<MonitorHandle, MonitorError> {
    let args = MonitorArgs {
        id: options.id.clone(),
        state_dir: options.state_dir.clone(),
        pid_file: options.pid_file.clone(),
        log_path: options.log_path.clone(),
        stdin: options.stdin,
        stdin_once: options.stdin_once,
        attach_socket: options.attach_socket.clone(),
        console_socket: options.console_socket.clone(),
        create_command: options.create_command.clone(),
        detached: false,
    };
    let mut child = Command::new(&options.monitor_binary)
        .args(args.to_args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| MonitorError::Spawn { binary: options.monitor_binary.clone(), source })?;

    // The report ends with EOF on stdout: the detached stage closes it right after reporting. Its
    // stderr closes at the same moment and only ever holds a few lines, so reading it second
    // cannot deadlock.
    let mut stdout = String::new();
    let mut stderr = String::new();
    let read = child.stdout.take().expect("stdout is piped").read_to_string(&mut stdout);
    let read_err = child.stderr.take().expect("stderr is piped").read_to_string(&mut stderr);
    // Reap the first stage (it exits as soon as the second one runs).
    let _ = child.wait();
    read.and(read_err).map_err(|source| MonitorError::Report { source })?;

    match Report::from_output(&stdout) {
        Some(Report::Created { monitor_pid, container_pid }) => Ok(MonitorHandle { monitor_pid, container_pid }),
        Some(Report::CreateFailed { exit_code, stderr }) => Err(MonitorError::CreateFailed { exit_code, stderr }),
        Some(Report::Failed { message }) => Err(MonitorError::Setup { message }),
        None => Err(MonitorError::NoReport { output: format!("{stdout}{stderr}").trim().to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(binary: &str) -> LaunchOptions {
        LaunchOptions {
            monitor_binary: binary.into(),
            id: "c".into(),
            state_dir: "/nonexistent".into(),
            log_path: None,
            pid_file: "/nonexistent/pid".into(),
            create_command: vec!["true".into()],
            stdin: false,
            stdin_once: false,
            attach_socket: None,
            console_socket: None,
        }
    }

    #[test]
    fn a_missing_monitor_binary_is_a_spawn_error() {
        let err = launch(&options("/nonexistent/berth-monitor")).unwrap_err();
        assert!(matches!(err, MonitorError::Spawn { .. }), "{err}");
    }

    #[test]
    fn a_monitor_that_exits_silently_is_reported_as_such() {
        let err = launch(&options("/bin/true")).unwrap_err();
        assert!(matches!(err, MonitorError::NoReport { .. }), "{err}");
    }
}
