//! The command line of `berth-monitor`, written by [`crate::launch`] and parsed by the binary, so
//! both sides share one definition.
//!
//! ```text
//! berth-monitor --id ID --state-dir DIR --pid-file FILE [--log-path FILE]
//!     [--stdin [--stdin-once]] [--attach-socket PATH] [--console-socket PATH] -- CREATE-ARGV...
//! ```
//!
//! `CREATE-ARGV` is the OCI runtime's create command (`runc --root R create --bundle B --pid-file
//! FILE ID`); the monitor runs it with the container's stdout and stderr pipes as its own and reads
//! the container's pid from `--pid-file` afterwards. All paths should be absolute: the monitor
//! changes to `/` once the container exists. `--detached` is internal (the second stage).
//!
//! `--stdin` gives the container a pipe as stdin, held open by the monitor (else /dev/null);
//! `--attach-socket` serves the attach protocol ([`crate::attach`]) at PATH, whose clients' input
//! goes to that pipe; `--stdin-once` closes it when the first client's input ends.
//!
//! `--console-socket PATH` is for a container with a terminal: the monitor listens there and the
//! create command (given the same path as its own `--console-socket`) sends it the pty's master,
//! which then takes the place of the stdout pipe and, with `--stdin`, of the stdin pipe.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

/// Errors in a monitor command line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArgsError {
    #[error("option {0} needs a value")]
    MissingValue(String),
    #[error("unknown option {0}")]
    Unknown(String),
    #[error("missing required option {0}")]
    Missing(&'static str),
    #[error("no create command after --")]
    NoCommand,
}

/// What a monitor is told to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonitorArgs {
    /// The container id (for messages).
    pub id: String,
    /// Where `monitor.pid` and `exit.json` go; created if missing.
    pub state_dir: PathBuf,
    /// The pid file the create command writes.
    pub pid_file: PathBuf,
    /// The CRI log file; without it the output is read and discarded.
    pub log_path: Option<PathBuf>,
    /// Give the container a stdin pipe that attach clients write to (else /dev/null).
    pub stdin: bool,
    /// Close the container's stdin when the first attach client's input ends (with `stdin`).
    pub stdin_once: bool,
    /// Where to serve the attach protocol; `None`: no attach.
    pub attach_socket: Option<PathBuf>,
    /// Where the OCI runtime sends the pty master of a container with a terminal.
    pub console_socket: Option<PathBuf>,
    /// The OCI runtime's create command.
    pub create_command: Vec<OsString>,
    /// Set on the second stage, which does the work after the first one detached it.
    pub detached: bool,
}

impl MonitorArgs {
    /// The arguments (without the program name) that [`MonitorArgs::parse`] reads back.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut out: Vec<OsString> = Vec::with_capacity(10 + self.create_command.len());
        out.extend(["--id".into(), self.id.clone().into()]);
        out.extend(["--state-dir".into(), self.state_dir.clone().into()]);
        out.extend(["--pid-file".into(), self.pid_file.clone().into()]);
        if let Some(log) = &self.log_path {
            out.extend(["--log-path".into(), log.clone().into()]);
        }
        if self.stdin {
            out.push("--stdin".into());
        }
        if self.stdin_once {
            out.push("--stdin-once".into());
        }
        if let Some(socket) = &self.attach_socket {
            out.extend(["--attach-socket".into(), socket.clone().into()]);
        }
        if let Some(socket) = &self.console_socket {
            out.extend(["--console-socket".into(), socket.clone().into()]);
        }
        if self.detached {
            out.push("--detached".into());
        }
        out.push("--".into());
        out.extend(self.create_command.iter().cloned());
        out
    }

    /// Parses the arguments after the program name.
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Self, ArgsError> {
        let mut args = args.into_iter();
        let (mut id, mut state_dir, mut pid_file, mut log_path) = (None, None, None, None);
        let (mut attach_socket, mut console_socket) = (None, None);
        let (mut detached, mut stdin, mut stdin_once) = (false, false, false);
        loop {
            let Some(arg) = args.next() else { return Err(ArgsError::NoCommand) };
            let flag = match arg.to_str() {
                Some("--detached") => Some(&mut detached),
                Some("--stdin") => Some(&mut stdin),
                Some("--stdin-once") => Some(&mut stdin_once),
                _ => None,
            };
            if let Some(flag) = flag {
                *flag = true;
                continue;
            }
            let slot = match arg.to_str() {
                Some("--") => break,
                Some("--id") => &mut id,
                Some("--state-dir") => &mut state_dir,
                Some("--pid-file") => &mut pid_file,
                Some("--log-path") => &mut log_path,
                Some("--attach-socket") => &mut attach_socket,
                Some("--console-socket") => &mut console_socket,
                _ => return Err(ArgsError::Unknown(arg.to_string_lossy().into_owned())),
            };
            let value = args.next().ok_or_else(|| ArgsError::MissingValue(arg.to_string_lossy().into_owned()))?;
            *slot = Some(value);
        }
        let create_command: Vec<OsString> = args.collect();
        if create_command.is_empty() {
            return Err(ArgsError::NoCommand);
        }
        Ok(MonitorArgs {
            id: id.ok_or(ArgsError::Missing("--id"))?.to_string_lossy().into_owned(),
            state_dir: state_dir.ok_or(ArgsError::Missing("--state-dir"))?.into(),
            pid_file: pid_file.ok_or(ArgsError::Missing("--pid-file"))?.into(),
            log_path: log_path.map(PathBuf::from),
            stdin,
            stdin_once,
            attach_socket: attach_socket.map(PathBuf::from),
            console_socket: console_socket.map(PathBuf::from),
            create_command,
            detached,
        })
    }

    /// The program of the create command.
    pub fn program(&self) -> &OsStr {
        &self.create_command[0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn written_arguments_parse_back_to_the_same_options() {
        let original = MonitorArgs {
            id: "c1".into(),
            state_dir: "/s".into(),
            pid_file: "/s/pid".into(),
            log_path: Some("/l/0.log".into()),
            stdin: true,
            stdin_once: true,
            attach_socket: Some("/run/berth/attach/c1.sock".into()),
            console_socket: Some("/run/berth/attach/c1.console".into()),
            create_command: args(&["runc", "create", "--bundle", "/b", "c1"]),
            detached: true,
        };
        assert_eq!(MonitorArgs::parse(original.to_args()).unwrap(), original);
        let no_log = MonitorArgs {
            log_path: None,
            detached: false,
            stdin: false,
            stdin_once: false,
            attach_socket: None,
            console_socket: None,
            ..original
        };
        assert_eq!(MonitorArgs::parse(no_log.to_args()).unwrap(), no_log);
    }

    #[test]
    fn options_of_the_create_command_are_not_taken_as_the_monitors() {
        let parsed =
            MonitorArgs::parse(args(&["--id", "c", "--state-dir", "/s", "--pid-file", "/p", "--", "x", "--id"]));
        assert_eq!(parsed.unwrap().create_command, args(&["x", "--id"]));
    }

    #[test]
    fn a_command_line_without_create_command_is_rejected() {
        let base = ["--id", "c", "--state-dir", "/s", "--pid-file", "/p"];
        assert_eq!(MonitorArgs::parse(args(&base)), Err(ArgsError::NoCommand));
        assert_eq!(MonitorArgs::parse(args(&[&base[..], &["--"]].concat())), Err(ArgsError::NoCommand));
    }

    #[test]
    fn missing_and_unknown_options_are_named() {
        assert_eq!(MonitorArgs::parse(args(&["--id", "c", "--", "x"])), Err(ArgsError::Missing("--state-dir")));
        assert_eq!(MonitorArgs::parse(args(&["--bogus", "--", "x"])), Err(ArgsError::Unknown("--bogus".into())));
        assert_eq!(MonitorArgs::parse(args(&["--id"])), Err(ArgsError::MissingValue("--id".into())));
    }
}
