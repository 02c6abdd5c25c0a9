//! The monitor process itself: detach from the launcher, run the create command with pipes as the
//! container's stdout and stderr, report, then copy the pipes into the CRI log until the
//! container's init exits, and record that exit.
//!
//! Two stages, so that the monitor is nobody's child: the first (started by [`crate::launch`])
//! starts the second (`--detached`) and exits at once; the second starts a new session, becomes
//! the child subreaper (the container's init, left behind by `runc create`, is reparented to it)
//! and writes its report to the stdout it inherited (the launcher's sync pipe), then points its
//! stdio at /dev/null. One thread, one poll(2) loop over the two pipes, a signalfd (SIGCHLD to
//! reap, SIGUSR1 to reopen the log, SIGWINCH to resize the terminal) and, with `--attach-socket`, the attach socket, its clients
//! and the container's stdin pipe ([`crate::attach`]).

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use berth_common::error::error_chain;
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, pipe2, read};

use crate::args::MonitorArgs;
use crate::attach::server::{AttachServer, Polled};
use crate::console::{ConsoleListener, apply_requested_size};
use crate::cri_log::{DEFAULT_MAX_LINE, LineAssembler, LogError, LogFile, LogWriter, Sink, Stream};
use crate::oom::OomCounter;
use crate::report::Report;
use crate::status::{ContainerExit, Durability, StatusError, write_atomic, write_exit};
use crate::time::rfc3339_nano;
use crate::{MONITOR_NAME, MONITOR_PID_FILE};

/// How much of a failed create's output goes into the report.
const MAX_CREATE_OUTPUT: usize = 64 * 1024;
/// Reads per pipe after the init exited: 4 MiB, more than a pipe buffers (1 MiB at most by
/// default, `/proc/sys/fs/pipe-max-size`).
const MAX_DRAIN_READS: usize = 256;
/// How long the OCI runtime's terminal may take to arrive once create returned (it is sent
/// during create, so it is normally there already).
const CONSOLE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the container's init may take to be reparented to the monitor after create returned.
const ADOPTION_TIMEOUT: Duration = Duration::from_secs(2);
/// How long attach clients get to take their last output and the exit frame.
const ATTACH_FINISH_TIMEOUT: Duration = Duration::from_secs(2);

/// Failures of the monitor process.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("starting the detached monitor")]
    Detach { source: io::Error },
    #[error("setting up the monitor process ({step})")]
    Setup { step: &'static str, source: Errno },
    #[error("creating state dir {path}")]
    StateDir { path: PathBuf, source: io::Error },
    #[error("recording the monitor pid")]
    MonitorPid { source: StatusError },
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("running the create command {program}")]
    Create { program: String, source: io::Error },
    #[error("reading the container pid from {path} (the container exists; delete it)")]
    ContainerPid { path: PathBuf, source: io::Error },
    #[error("container pid {pid} is not a child of the monitor (the container exists; delete it)")]
    NotAChild { pid: i32 },
    #[error("serving attach on {path}")]
    AttachSocket { path: PathBuf, source: io::Error },
    #[error("listening for the terminal on {path}")]
    ConsoleSocket { path: PathBuf, source: io::Error },
    #[error("receiving the container's terminal (the container exists; delete it)")]
    Terminal { source: io::Error },
    #[error("waiting for events")]
    Poll { source: Errno },
    #[error("recording the exit")]
    Exit { source: StatusError },
}

/// The binary's whole life; returns its exit code.
pub fn main() -> i32 {
    let args = match MonitorArgs::parse(std::env::args_os().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            send_report(&Report::Failed { message: e.to_string() });
            return 2;
        }
    };
    if args.detached {
        return main_detached(&args);
    }
    match detach(&args) {
        Ok(code) => code,
        Err(e) => {
            send_report(&Report::Failed { message: error_chain(&e) });
            1
        }
    }
}

/// The second stage's whole life; returns its exit code.
fn main_detached(args: &MonitorArgs) -> i32 {
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            // Before the report this reaches the launcher; afterwards stdio is /dev/null.
            send_report(&Report::Failed { message: error_chain(&e) });
            let _ = fs::remove_file(args.state_dir.join(MONITOR_PID_FILE));
            1
        }
    }
}

/// The first stage: fork the second one, which inherits the sync pipe, and leave. (A fork
/// rather than a second exec of the binary: this is on the path of every container start.)
#[allow(unsafe_code)]
fn detach(args: &MonitorArgs) -> Result<i32, DaemonError> {
    // SAFETY: the first stage is single-threaded (nothing before this spawns a thread), so the
    // child may run any code after the fork.
    match unsafe { nix::unistd::fork() } {
        Ok(ForkResult::Parent { .. }) => Ok(0),
        Ok(ForkResult::Child) => {
            let code = main_detached(&MonitorArgs { detached: true, ..args.clone() });
            std::process::exit(code)
        }
        Err(e) => Err(DaemonError::Detach { source: io::Error::from(e) }),
    }
}

/// One of the container's output pipes.
struct Pipe {
    fd: OwnedFd,
    stream: Stream,
    lines: LineAssembler,
}

impl Pipe {
    fn new(fd: OwnedFd, stream: Stream) -> Self {
        Pipe { fd, stream, lines: LineAssembler::new(stream, DEFAULT_MAX_LINE) }
    }
}

/// Where the container's output goes: the CRI log and attach clients.
struct Outputs {
    log: LogWriter,
    attach: Option<AttachServer>,
}

/// What poll(2) reported ready.
struct Events {
    signalled: bool,
    pipes: [bool; 2],
    attach: Vec<Polled>,
    attach_ready: Vec<PollFlags>,
}

/// What the monitor learned when the container's init was reaped.
struct Reaped {
    exit_code: i32,
    signal: Option<i32>,
}

/// The second stage.
fn run(args: &MonitorArgs) -> Result<i32, DaemonError> {
    let setup = |step| move |source| DaemonError::Setup { step, source };
    // `comm` is what `is_alive` checks, whatever the binary file is called.
    if let Ok(name) = std::ffi::CString::new(MONITOR_NAME) {
        let _ = nix::sys::prctl::set_name(&name);
    }
    nix::unistd::setsid().map_err(setup("setsid"))?;
    nix::sys::prctl::set_child_subreaper(true).map_err(setup("subreaper"))?;
    // Blocked before the create command runs, so that no SIGCHLD is lost; Command clears the
    // mask again in its children.
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    mask.add(Signal::SIGUSR1);
    mask.add(Signal::SIGWINCH);
    mask.thread_block().map_err(setup("signal mask"))?;
    let signals =
        SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).map_err(setup("signalfd"))?;

    fs::create_dir_all(&args.state_dir)
        .map_err(|source| DaemonError::StateDir { path: args.state_dir.clone(), source })?;
    let monitor_pid_file = args.state_dir.join(MONITOR_PID_FILE);
    // Unsynced: it is on the path of every container create, and a host crash ends the monitor.
    write_atomic(&monitor_pid_file, format!("{}\n", std::process::id()).as_bytes(), Durability::Unsynced)
        .map_err(|source| DaemonError::MonitorPid { source })?;
    let log = LogWriter::new(match &args.log_path {
        Some(path) => Sink::File(LogFile::open(path)?),
        None => Sink::Discard,
    });

    let (out_r, out_w) = pipe2(OFlag::O_CLOEXEC).map_err(setup("pipe"))?;
    let (err_r, err_w) = pipe2(OFlag::O_CLOEXEC).map_err(setup("pipe"))?;
    for fd in [&out_r, &err_r] {
        fcntl(fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(setup("nonblocking pipe"))?;
    }
    let console = match &args.console_socket {
        Some(path) => Some(
            ConsoleListener::bind(path).map_err(|source| DaemonError::ConsoleSocket { path: path.clone(), source })?,
        ),
        None => None,
    };
    // The container's stdin: a pipe whose write end only the monitor holds (close-on-exec), so
    // that the container sees EOF exactly when the monitor closes it. With a terminal: its pty.
    let (stdin_r, mut stdin_w) = match args.stdin && console.is_none() {
        true => {
            let (r, w) = pipe2(OFlag::O_CLOEXEC).map_err(setup("pipe"))?;
            fcntl(&w, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(setup("nonblocking pipe"))?;
            (Stdio::from(r), Some(File::from(w)))
        }
        false => (Stdio::null(), None),
    };
    // Listening before the container exists: a client attached before `start` misses nothing.
    let attach = match &args.attach_socket {
        Some(path) => Some(
            AttachServer::bind(path, stdin_w.take(), args.stdin_once)
                .map_err(|source| DaemonError::AttachSocket { path: path.clone(), source })?,
        ),
        None => None,
    };
    // Without an attach socket the write end is only held (until the monitor exits): the
    // container's stdin stays open, as CRI `stdin` asks, though nobody writes to it.
    let _held_stdin = stdin_w;
    let mut outputs = Outputs { log, attach };
    let program = args.program().to_string_lossy().into_owned();
    let status = Command::new(args.program())
        .args(&args.create_command[1..])
        .stdin(stdin_r)
        .stdout(Stdio::from(out_w))
        .stderr(Stdio::from(err_w))
        .status()
        .map_err(|source| DaemonError::Create { program, source })?;
    if !status.success() {
        // What the OCI runtime printed went to the container's pipes; it is the error message.
        let mut output = drain_to_string(&err_r);
        output.push_str(&drain_to_string(&out_r));
        let _ = fs::remove_file(&monitor_pid_file);
        send_report(&Report::CreateFailed { exit_code: status.code(), stderr: output.trim().to_string() });
        return Ok(1);
    }

    // The pty master arrived during create; its output is the container's stdout and stderr.
    let master = match console {
        Some(listener) => {
            let master = listener.receive_master(CONSOLE_TIMEOUT).map_err(|source| DaemonError::Terminal { source })?;
            fcntl(&master, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(setup("nonblocking terminal"))?;
            Some(master)
        }
        None => None,
    };
    let container = read_container_pid(args)?;
    // `crun run --detach` returns once its intermediate process reported, which may be a moment
    // before that process exits and the container's init is reparented to us (the subreaper).
    if !adopted(container, ADOPTION_TIMEOUT) {
        return Err(DaemonError::NotAChild { pid: container.as_raw() });
    }
    let mut reaped = match waitpid(container, Some(WaitPidFlag::WNOHANG)) {
        Err(Errno::ECHILD) => return Err(DaemonError::NotAChild { pid: container.as_raw() }),
        Ok(status) => reaped_from(status, container),
        Err(_) => None,
    };
    let oom = OomCounter::of_process(container.as_raw());
    let oom_before = oom.as_ref().and_then(OomCounter::read);

    send_report(&Report::Created { monitor_pid: std::process::id() as i32, container_pid: container.as_raw() });
    quiet_stdio();
    let _ = std::env::set_current_dir("/");

    let out = match &master {
        Some(master) => {
            if let (true, Some(attach)) = (args.stdin, outputs.attach.as_mut()) {
                let input = master.try_clone().map_err(|e| DaemonError::Terminal { source: e })?;
                attach.set_input(File::from(input));
            }
            master.try_clone().map_err(|e| DaemonError::Terminal { source: e })?
        }
        None => out_r,
    };
    let mut pipes = [Some(Pipe::new(out, Stream::Stdout)), Some(Pipe::new(err_r, Stream::Stderr))];
    let mut buf = vec![0u8; DEFAULT_MAX_LINE];
    crate::trim::drop_file_pages();
    while reaped.is_none() {
        let events = wait_for_events(&signals, &pipes, outputs.attach.as_ref())?;
        for (slot, ready) in pipes.iter_mut().zip(events.pipes) {
            if ready {
                read_once(slot, &mut buf, &mut outputs);
            }
        }
        if let Some(attach) = &mut outputs.attach {
            attach.handle(&events.attach, &events.attach_ready, &mut buf);
        }
        if events.signalled {
            while let Ok(Some(info)) = signals.read_signal() {
                match Signal::try_from(info.ssi_signo as i32) {
                    Ok(Signal::SIGCHLD) => reaped = reaped.or(reap_children(container)),
                    Ok(Signal::SIGUSR1) => {
                        let _ = outputs.log.reopen();
                    }
                    Ok(Signal::SIGWINCH) => {
                        if let Some(master) = &master {
                            apply_requested_size(&args.state_dir, master);
                        }
                    }
                    _ => {}
                }
            }
        }
        outputs.log.flush();
    }

    // The init is gone; what it wrote is still in the pipes. Other holders of the pipes (in a
    // shared pid namespace) are not waited for, and cannot keep the monitor reading forever.
    for slot in &mut pipes {
        let mut reads = 0;
        while reads < MAX_DRAIN_READS && read_once(slot, &mut buf, &mut outputs) {
            reads += 1;
        }
        if let Some(pipe) = slot {
            pipe.lines.finish(&mut outputs.log);
        }
    }
    outputs.log.flush();

    let reaped = reaped.expect("the loop ends when the init is reaped");
    let oom_after = oom.as_ref().and_then(OomCounter::read);
    let exit = ContainerExit {
        exit_code: reaped.exit_code,
        signal: reaped.signal,
        finished_at: rfc3339_nano(SystemTime::now()),
        oom_killed: matches!((oom_before, oom_after), (Some(before), Some(after)) if after > before),
    };
    write_exit(&args.state_dir, &exit).map_err(|source| DaemonError::Exit { source })?;
    // After exit.json: a client told the exit code finds the container exited.
    if let Some(attach) = outputs.attach.take() {
        attach.finish(exit.exit_code, ATTACH_FINISH_TIMEOUT);
    }
    let _ = fs::remove_file(&monitor_pid_file);
    Ok(0)
}

/// Blocks until a signal, pipe or attach descriptor is ready; says which.
fn wait_for_events(
    signals: &SignalFd,
    pipes: &[Option<Pipe>; 2],
    attach: Option<&AttachServer>,
) -> Result<Events, DaemonError> {
    let mut fds = Vec::with_capacity(3);
    fds.push(PollFd::new(signals.as_fd(), PollFlags::POLLIN));
    let open: Vec<usize> = (0..2).filter(|&i| pipes[i].is_some()).collect();
    for &i in &open {
        let pipe = pipes[i].as_ref().expect("filtered on is_some");
        fds.push(PollFd::new(pipe.fd.as_fd(), PollFlags::POLLIN));
    }
    let attach_start = fds.len();
    let mut polled = Vec::new();
    if let Some(attach) = attach {
        attach.register(&mut fds, &mut polled);
    }
    loop {
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => break,
            Err(Errno::EINTR) => continue,
            Err(source) => return Err(DaemonError::Poll { source }),
        }
    }
    let is_ready = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
    let mut ready = [false; 2];
    for (k, &i) in open.iter().enumerate() {
        ready[i] = is_ready(&fds[k + 1]);
    }
    let attach_ready = fds[attach_start..].iter().map(|fd| fd.revents().unwrap_or(PollFlags::empty())).collect();
    Ok(Events { signalled: is_ready(&fds[0]), pipes: ready, attach: polled, attach_ready })
}

/// Reads once from a pipe into the log lines and to attach clients; closes it at EOF or on an
/// error. Returns whether something was read.
fn read_once(slot: &mut Option<Pipe>, buf: &mut [u8], outputs: &mut Outputs) -> bool {
    let Some(pipe) = slot else { return false };
    match read(&pipe.fd, buf) {
        Ok(0) | Err(Errno::EBADF | Errno::EINVAL | Errno::EIO) => {
            pipe.lines.finish(&mut outputs.log);
            *slot = None;
            false
        }
        Ok(n) => {
            outputs.log.stamp(SystemTime::now());
            pipe.lines.push(&buf[..n], &mut outputs.log);
            if let Some(attach) = &mut outputs.attach {
                attach.broadcast(pipe.stream, &buf[..n]);
            }
            true
        }
        Err(_) => false, // EAGAIN, EINTR: nothing now
    }
}

/// Whether `pid` is (or within `timeout` becomes) a child of this process.
fn adopted(pid: Pid, timeout: Duration) -> bool {
    let me = std::process::id() as i32;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match crate::control::proc_stat(pid.as_raw()).map(|s| s.ppid) {
            Some(parent) if parent == me => return true,
            // Gone without being ours: whoever reaped it has its exit status.
            None => return false,
            Some(_) if std::time::Instant::now() >= deadline => return false,
            Some(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// Reaps every child that has exited; returns the container's exit if it was among them.
fn reap_children(container: Pid) -> Option<Reaped> {
    let mut found = None;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return found,
            Ok(status) => found = found.or(reaped_from(status, container)),
            Err(Errno::EINTR) => {}
            Err(_) => return found,
        }
    }
}

fn reaped_from(status: WaitStatus, container: Pid) -> Option<Reaped> {
    match status {
        WaitStatus::Exited(pid, code) if pid == container => Some(Reaped { exit_code: code, signal: None }),
        WaitStatus::Signaled(pid, signal, _) if pid == container => {
            Some(Reaped { exit_code: 128 + signal as i32, signal: Some(signal as i32) })
        }
        _ => None,
    }
}

fn read_container_pid(args: &MonitorArgs) -> Result<Pid, DaemonError> {
    let path = &args.pid_file;
    let text = fs::read_to_string(path).map_err(|source| DaemonError::ContainerPid { path: path.clone(), source })?;
    match text.trim().parse::<i32>() {
        Ok(pid) if pid > 0 => Ok(Pid::from_raw(pid)),
        _ => Err(DaemonError::ContainerPid {
            path: path.clone(),
            source: io::Error::new(io::ErrorKind::InvalidData, format!("not a pid: {text:?}")),
        }),
    }
}

/// Everything readable now from a non-blocking pipe, as text, up to [`MAX_CREATE_OUTPUT`].
fn drain_to_string(fd: &OwnedFd) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while out.len() < MAX_CREATE_OUTPUT {
        match read(fd, &mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(Errno::EINTR) => {}
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Writes the report line to stdout (the launcher's sync pipe). A launcher that died meanwhile
/// makes this fail (EPIPE; Rust ignores SIGPIPE), which must not stop the monitor.
fn send_report(report: &Report) {
    let mut stdout = io::stdout().lock();
    let _ = stdout.write_all(report.to_line().as_bytes());
    let _ = stdout.flush();
}

/// Points stdin, stdout and stderr at /dev/null, which closes the sync pipe: the launcher's EOF.
fn quiet_stdio() {
    if let Ok(null) = File::options().read(true).write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stdin(&null);
        let _ = nix::unistd::dup2_stdout(&null);
        let _ = nix::unistd::dup2_stderr(&null);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_adopted_at_once_and_a_stranger_never() {
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        assert_eq!(crate::control::proc_stat(pid.as_raw()).map(|s| s.ppid), Some(std::process::id() as i32));
        assert!(adopted(pid, Duration::ZERO));
        // Our own parent is nobody's child of ours.
        assert!(!adopted(nix::unistd::getppid(), Duration::from_millis(20)));
        assert!(!adopted(Pid::from_raw(i32::MAX), Duration::from_millis(20)), "no such process");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
