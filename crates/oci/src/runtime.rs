//! The typed driver of one OCI runtime binary (runc, crun, runsc): its command lines, the JSON it
//! prints, and its failures mapped to [`OciError`].
//!
//! Every operation builds an argv of the form `BINARY [GLOBAL_ARGS] [--root ROOT] VERB [FLAGS] ID`
//! and runs it through the [`Spawner`] given to [`OciRuntime::new`]. The verbs that leave a
//! process behind (`create`, `exec --detach`) also have an `*_args` form that returns the full
//! argv, so that a monitor process can exec it with the stdio it holds for the container.

mod spawner;

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::{self, Read, Seek};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::Arc;

use nix::sys::signal::Signal;
use serde::{Deserialize, Deserializer, Serialize};

pub use spawner::{ProcessSpawner, RecordingSpawner, Spawner};

/// A failure of an OCI runtime command.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The runtime binary could not be started, or its output could not be collected.
    #[error("could not run `{command}`")]
    Spawn {
        command: String,
        #[source]
        source: io::Error,
    },
    /// The runtime ran and failed; `stderr` is what it said.
    #[error("`{command}` failed ({status}): {stderr}")]
    CommandFailed { command: String, status: ExitStatus, stderr: String },
    /// The runtime does not know the container (recognised from each runtime's wording).
    #[error("container {id} does not exist")]
    NotFound { id: String },
    /// The runtime succeeded but printed something that is not the JSON it should print.
    #[error("unexpected output from `{command}`")]
    InvalidOutput {
        command: String,
        #[source]
        source: serde_json::Error,
    },
}

impl OciError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, OciError::NotFound { .. })
    }
}

/// Lifecycle status of a container as the runtime reports it (OCI runtime spec, "State").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Creating,
    Created,
    Running,
    Stopped,
    Paused,
}

impl Status {
    /// `start` applies only to a created container.
    pub fn can_start(self) -> bool {
        self == Status::Created
    }

    /// A signal can be delivered while the container's process exists.
    pub fn can_kill(self) -> bool {
        matches!(self, Status::Created | Status::Running | Status::Paused)
    }

    /// `delete` without `--force` applies only to a stopped container.
    pub fn can_delete(self) -> bool {
        self == Status::Stopped
    }

    /// `exec` needs a running container.
    pub fn can_exec(self) -> bool {
        self == Status::Running
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Creating => "creating",
            Status::Created => "created",
            Status::Running => "running",
            Status::Stopped => "stopped",
            Status::Paused => "paused",
        })
    }
}

/// The state of one container: `state ID`, or one entry of `list --format json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    pub id: String,
    pub status: Status,
    /// The container's init process on the host; `None` once it is gone (runc and crun print 0,
    /// runsc -1).
    #[serde(default, deserialize_with = "nonzero_pid")]
    pub pid: Option<u32>,
    #[serde(default)]
    pub bundle: PathBuf,
    #[serde(default, deserialize_with = "null_as_default")]
    pub annotations: HashMap<String, String>,
}

fn nonzero_pid<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    Ok(Option::<i64>::deserialize(d)?.and_then(|pid| u32::try_from(pid).ok()).filter(|pid| *pid != 0))
}

fn null_as_default<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// The runtime's `--version`, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// The first word of the first line: `runc`, `crun`, `runsc`.
    pub name: String,
    pub version: String,
    /// The OCI runtime spec version it implements (`spec: 1.0.2-dev`).
    pub spec: Option<String>,
    pub commit: Option<String>,
}

/// Flags of `create`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateOptions {
    pub bundle: PathBuf,
    pub pid_file: Option<PathBuf>,
    pub console_socket: Option<PathBuf>,
    pub no_pivot: bool,
}

impl CreateOptions {
    pub fn new(bundle: impl Into<PathBuf>) -> Self {
        Self { bundle: bundle.into(), ..Self::default() }
    }

    pub fn pid_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.pid_file = Some(path.into());
        self
    }

    pub fn console_socket(mut self, path: impl Into<PathBuf>) -> Self {
        self.console_socket = Some(path.into());
        self
    }

    pub fn no_pivot(mut self, no_pivot: bool) -> Self {
        self.no_pivot = no_pivot;
        self
    }
}

/// Flags of `exec`. `process` is a file holding the OCI `process` object as JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOptions {
    pub process: PathBuf,
    pub detach: bool,
    /// Where the runtime writes the pid of the process on the host: the process itself under
    /// runc and crun, but the `runsc exec` client under runsc (the process runs in the sandbox).
    pub pid_file: Option<PathBuf>,
    /// runsc only: where it writes the process's pid inside the sandbox, which
    /// [`OciRuntime::kill_process`] takes.
    pub internal_pid_file: Option<PathBuf>,
    pub console_socket: Option<PathBuf>,
}

impl ExecOptions {
    pub fn new(process: impl Into<PathBuf>) -> Self {
        Self { process: process.into(), ..Self::default() }
    }

    pub fn detach(mut self, detach: bool) -> Self {
        self.detach = detach;
        self
    }

    pub fn pid_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.pid_file = Some(path.into());
        self
    }

    pub fn internal_pid_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.internal_pid_file = Some(path.into());
        self
    }

    pub fn console_socket(mut self, path: impl Into<PathBuf>) -> Self {
        self.console_socket = Some(path.into());
        self
    }
}

/// What an attached `exec` left behind: the exit status of the runtime, which is the exit status of
/// the executed process once it ran, and its captured output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// One OCI runtime binary with the global arguments and state root it is always run with.
#[derive(Debug, Clone)]
pub struct OciRuntime {
    binary: PathBuf,
    global_args: Vec<String>,
    root: Option<PathBuf>,
    spawner: Arc<dyn Spawner>,
}

impl OciRuntime {
    /// A runtime run through `spawner`: [`ProcessSpawner`] for real, [`RecordingSpawner`] in tests.
    pub fn new(binary: impl Into<PathBuf>, spawner: Arc<dyn Spawner>) -> Self {
        Self { binary: binary.into(), global_args: Vec::new(), root: None, spawner }
    }

    /// Arguments placed before the verb on every command, e.g. runsc's `--platform=ptrace`.
    pub fn with_global_args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.global_args.extend(args.into_iter().map(Into::into));
        self
    }

    /// The runtime's state directory (`--root`); the runtime's own default when unset.
    pub fn with_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.root = Some(root.into());
        self
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    pub fn global_args(&self) -> &[String] {
        &self.global_args
    }

    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// The full argv (binary first) of `create`, for a monitor that execs it with its own stdio.
    pub fn create_args(&self, id: &str, opts: &CreateOptions) -> Vec<OsString> {
        self.create_or_run_args("create", id, opts)
    }

    /// The full argv (binary first) of `run --detach`: `create` and `start` in one invocation
    /// (runc, crun and runsc all have it), for a monitor that execs it with its own stdio. It
    /// returns once the container's process runs, leaving it to the caller (a subreaper).
    pub fn run_detached_args(&self, id: &str, opts: &CreateOptions) -> Vec<OsString> {
        self.create_or_run_args("run", id, opts)
    }

    fn create_or_run_args(&self, verb: &str, id: &str, opts: &CreateOptions) -> Vec<OsString> {
        let mut args = self.verb(verb);
        if verb == "run" {
            args.push("--detach".into());
        }
        push(&mut args, ["--bundle".as_ref(), opts.bundle.as_os_str()]);
        if let Some(p) = &opts.pid_file {
            push(&mut args, ["--pid-file".as_ref(), p.as_os_str()]);
        }
        if let Some(p) = &opts.console_socket {
            push(&mut args, ["--console-socket".as_ref(), p.as_os_str()]);
        }
        if opts.no_pivot {
            args.push("--no-pivot".into());
        }
        args.push(id.into());
        args
    }

    /// Creates the container. Its init process gets null stdin and stdout, and shares with the
    /// runtime an anonymous file as stderr (read back for the runtime's error message); a caller
    /// that needs the container's output runs [`create_args`](Self::create_args) itself instead.
    pub fn create(&self, id: &str, opts: &CreateOptions) -> Result<(), OciError> {
        self.run_detached(self.create_args(id, opts), Some(id)).map(drop)
    }

    pub fn start(&self, id: &str) -> Result<(), OciError> {
        let mut args = self.verb("start");
        args.push(id.into());
        self.run(args, Some(id)).map(drop)
    }

    pub fn state(&self, id: &str) -> Result<State, OciError> {
        let mut args = self.verb("state");
        args.push(id.into());
        let command = render(&args);
        let out = self.run(args, Some(id))?;
        serde_json::from_slice(&out.stdout).map_err(|source| OciError::InvalidOutput { command, source })
    }

    /// Sends `signal` to the container's init process, or with `all` to every process in it.
    pub fn kill(&self, id: &str, signal: Signal, all: bool) -> Result<(), OciError> {
        let mut args = self.verb("kill");
        if all {
            args.push("--all".into());
        }
        args.push(id.into());
        args.push((signal as i32).to_string().into());
        self.run(args, Some(id)).map(drop)
    }

    /// runsc only: sends `signal` to one process of the container, `pid` as the sandbox sees it
    /// (what [`ExecOptions::internal_pid_file`] received). The way to end an exec under runsc:
    /// killing the `runsc exec` client on the host leaves the process running in the sandbox.
    pub fn kill_process(&self, id: &str, pid: u32, signal: Signal) -> Result<(), OciError> {
        let mut args = self.verb("kill");
        push(&mut args, ["--pid".to_owned(), pid.to_string()]);
        args.push(id.into());
        args.push((signal as i32).to_string().into());
        self.run(args, Some(id)).map(drop)
    }

    /// Deletes the container. With `force` a running container is killed first; runc, crun and
    /// runsc all report success for a container that does not exist when forced.
    pub fn delete(&self, id: &str, force: bool) -> Result<(), OciError> {
        let mut args = self.verb("delete");
        if force {
            args.push("--force".into());
        }
        args.push(id.into());
        self.run(args, Some(id)).map(drop)
    }

    /// Every container under this runtime's root.
    pub fn list(&self) -> Result<Vec<State>, OciError> {
        let mut args = self.verb("list");
        push(&mut args, ["--format", "json"]);
        let command = render(&args);
        let out = self.run(args, None)?;
        // runc and runsc print `null` for none, crun an empty array.
        serde_json::from_slice::<Option<Vec<State>>>(&out.stdout)
            .map(Option::unwrap_or_default)
            .map_err(|source| OciError::InvalidOutput { command, source })
    }

    /// The full argv (binary first) of `exec`.
    pub fn exec_args(&self, id: &str, opts: &ExecOptions) -> Vec<OsString> {
        let mut args = self.verb("exec");
        push(&mut args, ["--process".as_ref(), opts.process.as_os_str()]);
        if opts.detach {
            args.push("--detach".into());
        }
        if let Some(p) = &opts.pid_file {
            push(&mut args, ["--pid-file".as_ref(), p.as_os_str()]);
        }
        if let Some(p) = &opts.internal_pid_file {
            push(&mut args, ["--internal-pid-file".as_ref(), p.as_os_str()]);
        }
        if let Some(p) = &opts.console_socket {
            push(&mut args, ["--console-socket".as_ref(), p.as_os_str()]);
        }
        args.push(id.into());
        args
    }

    /// Runs a process in the container.
    ///
    /// Attached, the process's output is captured and its exit status returned as is: a non-zero
    /// exit is the process's business, not an error, unless the runtime's stderr says the
    /// container does not exist. Detached, the runtime returns once the process started and a
    /// non-zero exit is [`OciError::CommandFailed`].
    pub fn exec(&self, id: &str, opts: &ExecOptions) -> Result<ExecOutput, OciError> {
        let args = self.exec_args(id, opts);
        if opts.detach {
            let out = self.run_detached(args, Some(id))?;
            return Ok(ExecOutput { status: out.status, stdout: out.stdout, stderr: out.stderr });
        }
        let out = self.spawn(args, None)?;
        if !out.status.success() && is_not_found(&String::from_utf8_lossy(&out.stderr), id) {
            return Err(OciError::NotFound { id: id.to_owned() });
        }
        Ok(ExecOutput { status: out.status, stdout: out.stdout, stderr: out.stderr })
    }

    /// Applies new resource limits; `resources` is a file holding an OCI `linux.resources` object.
    pub fn update(&self, id: &str, resources: &Path) -> Result<(), OciError> {
        let mut args = self.verb("update");
        push(&mut args, ["--resources".as_ref(), resources.as_os_str()]);
        args.push(id.into());
        self.run(args, Some(id)).map(drop)
    }

    /// What the runtime supports (`features`, runc ≥ 1.1); `None` when it has no such verb
    /// (crun 1.8, runsc).
    pub fn features(&self) -> Result<Option<oci_spec::runtime::Features>, OciError> {
        let args = self.verb("features");
        let command = render(&args);
        match self.run(args, None) {
            Ok(out) => serde_json::from_slice(&out.stdout)
                .map(Some)
                .map_err(|source| OciError::InvalidOutput { command, source }),
            Err(OciError::CommandFailed { stderr, .. }) if is_unknown_verb(&stderr) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn version(&self) -> Result<Version, OciError> {
        let mut args = self.base();
        args.push("--version".into());
        let out = self.run(args, None)?;
        Ok(parse_version(&String::from_utf8_lossy(&out.stdout)))
    }

    /// `BINARY GLOBAL_ARGS [--root ROOT]`.
    fn base(&self) -> Vec<OsString> {
        let mut args = vec![self.binary.clone().into_os_string()];
        args.extend(self.global_args.iter().map(OsString::from));
        if let Some(root) = &self.root {
            push(&mut args, ["--root".as_ref(), root.as_os_str()]);
        }
        args
    }

    fn verb(&self, verb: &str) -> Vec<OsString> {
        let mut args = self.base();
        args.push(verb.into());
        args
    }

    /// Runs `argv` with captured output; a non-zero exit becomes `NotFound` (when `id` is given
    /// and stderr says so) or `CommandFailed`.
    fn run(&self, argv: Vec<OsString>, id: Option<&str>) -> Result<Output, OciError> {
        let command = render(&argv);
        let out = self.spawn(argv, None)?;
        check(command, out, id)
    }

    /// Runs a verb that leaves a process behind holding the runtime's stdio: stdout goes to null
    /// and stderr to an anonymous file, so that waiting for the runtime never waits for the
    /// container to close a pipe.
    fn run_detached(&self, argv: Vec<OsString>, id: Option<&str>) -> Result<Output, OciError> {
        let command = render(&argv);
        let spawn_err = |source| OciError::Spawn { command: command.clone(), source };
        let mut stderr_file = tempfile::tempfile().map_err(spawn_err)?;
        let mut out = self.spawn(argv, Some(stderr_file.try_clone().map_err(spawn_err)?))?;
        let mut captured = Vec::new();
        stderr_file.rewind().and_then(|()| stderr_file.read_to_end(&mut captured)).map_err(spawn_err)?;
        out.stderr.extend(captured);
        check(command, out, id)
    }

    fn spawn(&self, argv: Vec<OsString>, stderr: Option<std::fs::File>) -> Result<Output, OciError> {
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]).stdin(Stdio::null());
        if let Some(file) = stderr {
            cmd.stdout(Stdio::null()).stderr(file);
        }
        self.spawner.run(&mut cmd).map_err(|source| OciError::Spawn { command: render(&argv), source })
    }
}

fn push<S: AsRef<OsStr>>(args: &mut Vec<OsString>, more: impl IntoIterator<Item = S>) {
    args.extend(more.into_iter().map(|a| a.as_ref().to_os_string()));
}

/// The argv as one line for error messages.
fn render(argv: &[OsString]) -> String {
    argv.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ")
}

fn check(command: String, out: Output, id: Option<&str>) -> Result<Output, OciError> {
    if out.status.success() {
        return Ok(out);
    }
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    match id {
        Some(id) if is_not_found(&stderr, id) => Err(OciError::NotFound { id: id.to_owned() }),
        _ => Err(OciError::CommandFailed { command, status: out.status, stderr }),
    }
}

/// Whether a runtime's stderr says that container `id` does not exist. The wordings:
/// - runc: `container does not exist`
/// - crun ≤ 1.8: ``error opening file `/run/crun/ID/status`: No such file or directory`` or
///   `cannot open directory '/run/crun/ID': No such file or directory`; newer crun: `can't find
///   container` / `container "ID" does not exist`
/// - runsc: `loading container "ID": file does not exist`, `container not found`
fn is_not_found(stderr: &str, id: &str) -> bool {
    let s = stderr.to_ascii_lowercase();
    if s.contains("container does not exist")
        || s.contains("can't find container")
        || s.contains("container not found")
        || (s.contains("loading container") && s.contains("does not exist"))
        || (s.contains("container") && s.contains(&format!("\"{}\" does not exist", id.to_ascii_lowercase())))
    {
        return true;
    }
    // crun names the missing state file or directory of the container (and only those: a missing
    // cgroup directory named after the container is another failure).
    s.contains("no such file or directory")
        && ((stderr.contains("error opening file `") && stderr.contains(&format!("/{id}/status`")))
            || (stderr.contains("cannot open directory '") && stderr.contains(&format!("/{id}'"))))
}

/// Whether a runtime's stderr says it has no such verb (crun: `unknown command`, runsc: usage).
fn is_unknown_verb(stderr: &str) -> bool {
    let s = stderr.to_ascii_lowercase();
    s.contains("unknown command") || s.contains("unknown subcommand") || s.contains("usage:")
}

fn parse_version(text: &str) -> Version {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or_default();
    let mut words = first.split_whitespace();
    let name = words.next().unwrap_or_default().to_owned();
    let version = match (words.next(), words.next()) {
        (Some("version"), Some(v)) => v.to_owned(),
        (Some(v), _) => v.to_owned(),
        _ => String::new(),
    };
    let mut v = Version { name, version, spec: None, commit: None };
    for line in lines {
        if let Some(s) = line.strip_prefix("spec:") {
            v.spec = Some(s.trim().to_owned());
        } else if let Some(c) = line.strip_prefix("commit:") {
            v.commit = Some(c.trim().to_owned());
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake() -> (Arc<RecordingSpawner>, OciRuntime) {
        let spawner = Arc::new(RecordingSpawner::new());
        let rt = OciRuntime::new("/usr/bin/runc", spawner.clone());
        (spawner, rt)
    }

    fn strings(argv: &[OsString]) -> Vec<String> {
        argv.iter().map(|a| a.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn run_detached_args_are_create_args_with_the_run_verb_and_detach() {
        let (_, rt) = fake();
        let rt = rt.with_root("/run/berth/runc");
        let opts = CreateOptions::new("/b/c1").pid_file("/b/c1/pid");
        assert_eq!(
            strings(&rt.run_detached_args("c1", &opts)),
            [
                "/usr/bin/runc",
                "--root",
                "/run/berth/runc",
                "run",
                "--detach",
                "--bundle",
                "/b/c1",
                "--pid-file",
                "/b/c1/pid",
                "c1"
            ]
        );
    }

    #[test]
    fn create_args_put_global_args_and_root_before_the_verb_and_the_id_last() {
        let (_, rt) = fake();
        let rt = rt.with_global_args(["--platform=ptrace", "--network=none"]).with_root("/run/berth/runsc");
        let opts = CreateOptions::new("/b/c1").pid_file("/b/c1/pid").console_socket("/b/c1/tty.sock").no_pivot(true);
        assert_eq!(
            strings(&rt.create_args("c1", &opts)),
            [
                "/usr/bin/runc",
                "--platform=ptrace",
                "--network=none",
                "--root",
                "/run/berth/runsc",
                "create",
                "--bundle",
                "/b/c1",
                "--pid-file",
                "/b/c1/pid",
                "--console-socket",
                "/b/c1/tty.sock",
                "--no-pivot",
                "c1"
            ]
        );
    }

    #[test]
    fn create_without_options_passes_only_the_bundle() {
        let (spawner, rt) = fake();
        rt.create("c1", &CreateOptions::new("/b")).unwrap();
        assert_eq!(spawner.last_args(), ["create", "--bundle", "/b", "c1"]);
    }

    #[test]
    fn verbs_build_the_documented_command_lines() {
        let (spawner, rt) = fake();
        rt.start("c1").unwrap();
        assert_eq!(spawner.last_args(), ["start", "c1"]);
        rt.kill("c1", Signal::SIGKILL, true).unwrap();
        assert_eq!(spawner.last_args(), ["kill", "--all", "c1", "9"]);
        rt.kill("c1", Signal::SIGTERM, false).unwrap();
        assert_eq!(spawner.last_args(), ["kill", "c1", "15"]);
        rt.kill_process("c1", 2, Signal::SIGKILL).unwrap();
        assert_eq!(spawner.last_args(), ["kill", "--pid", "2", "c1", "9"]);
        rt.delete("c1", true).unwrap();
        assert_eq!(spawner.last_args(), ["delete", "--force", "c1"]);
        rt.delete("c1", false).unwrap();
        assert_eq!(spawner.last_args(), ["delete", "c1"]);
        rt.update("c1", Path::new("/b/res.json")).unwrap();
        assert_eq!(spawner.last_args(), ["update", "--resources", "/b/res.json", "c1"]);
        spawner.reply(0, "null", "");
        rt.list().unwrap();
        assert_eq!(spawner.last_args(), ["list", "--format", "json"]);
    }

    #[test]
    fn exec_args_carry_the_process_file_and_detach_flags() {
        let (_, rt) = fake();
        let opts = ExecOptions::new("/b/exec.json").detach(true).pid_file("/b/exec.pid");
        assert_eq!(
            strings(&rt.exec_args("c1", &opts))[1..],
            ["exec", "--process", "/b/exec.json", "--detach", "--pid-file", "/b/exec.pid", "c1"]
        );
    }

    #[test]
    fn a_runsc_exec_can_also_write_the_pid_the_sandbox_gives_the_process() {
        let (_, rt) = fake();
        let opts = ExecOptions::new("/b/exec.json").pid_file("/b/exec.pid").internal_pid_file("/b/exec.ipid");
        assert_eq!(
            strings(&rt.exec_args("c1", &opts))[1..],
            [
                "exec",
                "--process",
                "/b/exec.json",
                "--pid-file",
                "/b/exec.pid",
                "--internal-pid-file",
                "/b/exec.ipid",
                "c1"
            ]
        );
    }

    #[test]
    fn state_parses_runtime_json_and_treats_pid_zero_or_negative_as_gone() {
        let (spawner, rt) = fake();
        spawner.reply(
            0,
            r#"{"ociVersion":"1.0.2-dev","id":"c1","pid":4242,"status":"running","bundle":"/b/c1",
               "rootfs":"/b/c1/rootfs","created":"2024-01-01T00:00:00Z","owner":"",
               "annotations":{"io.kubernetes.cri.container-type":"container"}}"#,
            "",
        );
        spawner.reply(0, r#"{"id":"c1","pid":0,"status":"stopped","bundle":"/b/c1","annotations":null}"#, "");
        spawner.reply(0, r#"{"id":"c1","pid":-1,"status":"stopped","bundle":"/b/c1"}"#, "");
        let running = rt.state("c1").unwrap();
        assert_eq!(running.status, Status::Running);
        assert_eq!(running.pid, Some(4242));
        assert_eq!(running.bundle, Path::new("/b/c1"));
        assert_eq!(running.annotations["io.kubernetes.cri.container-type"], "container");
        let stopped = rt.state("c1").unwrap();
        assert_eq!((stopped.status, stopped.pid), (Status::Stopped, None));
        assert!(stopped.annotations.is_empty());
        assert_eq!(rt.state("c1").unwrap().pid, None, "runsc's -1");
    }

    #[test]
    fn state_output_that_is_not_json_is_invalid_output() {
        let (spawner, rt) = fake();
        spawner.reply(0, "ID PID STATUS", "");
        assert!(matches!(rt.state("c1"), Err(OciError::InvalidOutput { .. })));
    }

    #[test]
    fn list_accepts_null_and_crun_style_arrays() {
        let (spawner, rt) = fake();
        spawner.reply(0, "null", "");
        spawner.reply(0, "[\n\n]", "");
        spawner.reply(0, r#"[{"id":"a","pid":7,"status":"created","bundle":"/b/a","created":"x","owner":"root"}]"#, "");
        assert!(rt.list().unwrap().is_empty());
        assert!(rt.list().unwrap().is_empty());
        let one = rt.list().unwrap();
        assert_eq!((one[0].id.as_str(), one[0].status, one[0].pid), ("a", Status::Created, Some(7)));
    }

    #[test]
    fn each_runtimes_wording_for_a_missing_container_is_not_found() {
        let wordings = [
            r#"time="2026-11-22T02:49:29Z" level=error msg="container does not exist""#,
            "error opening file `/run/crun/c1/status`: No such file or directory",
            "cannot open directory '/run/crun/c1': No such file or directory",
            "can't find container c1",
            "loading container: file does not exist",
            r#"loading container "c1": file does not exist"#,
            "container not found",
        ];
        for wording in wordings {
            let (spawner, rt) = fake();
            spawner.reply(1, "", wording);
            let err = rt.kill("c1", Signal::SIGKILL, false).unwrap_err();
            assert!(matches!(&err, OciError::NotFound { id } if id == "c1"), "{wording}: {err:?}");
        }
    }

    #[test]
    fn other_failures_are_command_failed_with_status_and_stderr() {
        let (spawner, rt) = fake();
        spawner.reply(1, "", "cannot start an already running container\n");
        match rt.start("c1").unwrap_err() {
            OciError::CommandFailed { command, status, stderr } => {
                assert_eq!(command, "/usr/bin/runc start c1");
                assert_eq!(status.code(), Some(1));
                assert_eq!(stderr, "cannot start an already running container");
            }
            other => panic!("{other:?}"),
        }
        // A missing file that is not the container's state is not a missing container.
        spawner.reply(1, "", "open /b/other/config.json: No such file or directory");
        assert!(matches!(rt.start("c1"), Err(OciError::CommandFailed { .. })));
        spawner.reply(
            1,
            "",
            "creating cgroup directory `/sys/fs/cgroup/systemd/berth-test/c1`: No such file or directory",
        );
        assert!(matches!(rt.start("c1"), Err(OciError::CommandFailed { .. })));
    }

    #[test]
    fn attached_exec_returns_the_process_exit_status_instead_of_failing() {
        let (spawner, rt) = fake();
        spawner.reply(3, "partial\n", "boom\n");
        let out = rt.exec("c1", &ExecOptions::new("/p.json")).unwrap();
        assert_eq!((out.status.code(), out.stdout.as_slice()), (Some(3), b"partial\n".as_slice()));
        spawner.reply(1, "", "container does not exist");
        assert!(rt.exec("c1", &ExecOptions::new("/p.json")).unwrap_err().is_not_found());
    }

    #[test]
    fn features_is_none_when_the_runtime_has_no_such_verb() {
        let (spawner, rt) = fake();
        spawner.reply(1, "", "unknown command features\n");
        assert!(rt.features().unwrap().is_none());
        spawner.reply(128, "", "Usage: runsc <flags> <subcommand> <subcommand args>\n");
        assert!(rt.features().unwrap().is_none());
        spawner.reply(1, "", "permission denied\n");
        assert!(rt.features().is_err());
        spawner.reply(0, r#"{"ociVersionMin":"1.0.0","ociVersionMax":"1.0.2-dev","hooks":["prestart"]}"#, "");
        let f = rt.features().unwrap().unwrap();
        assert_eq!(f.oci_version_max(), "1.0.2-dev");
    }

    #[test]
    fn version_parses_the_name_version_spec_and_commit_lines() {
        let (spawner, rt) = fake();
        spawner.reply(0, "runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1\nspec: 1.0.2-dev\ngo: go1.19.8\n", "");
        let v = rt.version().unwrap();
        assert_eq!(spawner.last_args(), ["--version"]);
        assert_eq!(
            v,
            Version {
                name: "runc".into(),
                version: "1.1.5+ds1".into(),
                spec: Some("1.0.2-dev".into()),
                commit: Some("1.1.5+ds1-1".into())
            }
        );
    }

    #[test]
    fn status_guards_follow_the_oci_lifecycle() {
        assert!(Status::Created.can_start() && !Status::Running.can_start());
        assert!(Status::Running.can_kill() && !Status::Stopped.can_kill());
        assert!(Status::Stopped.can_delete() && !Status::Running.can_delete());
        assert!(Status::Running.can_exec() && !Status::Created.can_exec());
    }

    #[test]
    fn bin_true_as_the_runtime_makes_every_verb_succeed() {
        let rt = OciRuntime::new("/bin/true", Arc::new(ProcessSpawner));
        rt.create("c1", &CreateOptions::new("/nonexistent")).unwrap();
        rt.start("c1").unwrap();
        rt.kill("c1", Signal::SIGKILL, false).unwrap();
        rt.delete("c1", false).unwrap();
        assert!(rt.exec("c1", &ExecOptions::new("/p.json")).unwrap().status.success());
        // `true` prints nothing, which is not a state.
        assert!(matches!(rt.state("c1"), Err(OciError::InvalidOutput { .. })));
    }

    #[test]
    fn bin_false_as_the_runtime_fails_every_verb_with_its_exit_status() {
        let rt = OciRuntime::new("/bin/false", Arc::new(ProcessSpawner)).with_root("/tmp/r");
        for result in [
            rt.create("c1", &CreateOptions::new("/b")),
            rt.start("c1"),
            rt.kill("c1", Signal::SIGTERM, false),
            rt.delete("c1", true),
        ] {
            match result.unwrap_err() {
                OciError::CommandFailed { command, status, stderr } => {
                    assert!(command.starts_with("/bin/false --root /tmp/r "), "{command}");
                    assert_eq!(status.code(), Some(1));
                    assert_eq!(stderr, "");
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(rt.features(), Err(OciError::CommandFailed { .. })));
    }

    #[test]
    fn a_missing_binary_is_a_spawn_error_naming_the_command() {
        let rt = OciRuntime::new("/nonexistent/runc", Arc::new(ProcessSpawner));
        let err = rt.start("c1").unwrap_err();
        assert!(matches!(&err, OciError::Spawn { command, .. } if command == "/nonexistent/runc start c1"), "{err:?}");
    }

    #[test]
    fn detached_create_reads_stderr_back_from_a_file_shared_with_the_container() {
        // sh as the "runtime": it writes to stderr and fails, as a runtime would.
        let rt = OciRuntime::new("/bin/sh", Arc::new(ProcessSpawner)).with_global_args([
            "-c",
            "echo \"create failed: $*\" >&2; exit 2",
            "rt",
        ]);
        match rt.create("c1", &CreateOptions::new("/b")).unwrap_err() {
            OciError::CommandFailed { status, stderr, .. } => {
                assert_eq!(status.code(), Some(2));
                assert_eq!(stderr, "create failed: create --bundle /b c1");
            }
            other => panic!("{other:?}"),
        }
    }
}
