//! `berth-monitor pause [--hostname NAME]`: a pod's infra process. Started by the runtime as
//! `unshare --fork [--pid] [--ipc] [--uts] berth-monitor pause`, it holds the pod's shared
//! namespaces for the containers to join (`/proc/<pid>/ns/…`), sets the pod's hostname in its UTS
//! namespace, reaps the orphans of a shared PID namespace (it is that namespace's init) and
//! exits on SIGTERM or SIGINT.
//!
//! It prints its pid as the host sees it (read from the host's `/proc/self`, since the mount
//! namespace is not private) as one line on stdout: the runtime's sign that the namespaces are
//! ready.

use std::io::Write;

use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{WaitPidFlag, waitpid};

/// The process's whole life as the infra process; `args` are those after `pause`.
pub fn main(args: &[String]) -> i32 {
    let hostname = match args {
        [] => None,
        [flag, name] if flag == "--hostname" => Some(name.as_str()),
        _ => {
            eprintln!("usage: berth-monitor pause [--hostname NAME]");
            return 2;
        }
    };
    if let Ok(name) = std::ffi::CString::new("berth-pause") {
        let _ = nix::sys::prctl::set_name(&name);
    }
    let mut signals = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGCHLD] {
        signals.add(s);
    }
    // Blocked before anything can send them, then taken one by one with sigwait.
    if let Err(e) = signals.thread_block() {
        eprintln!("berth-pause: blocking signals: {e}");
        return 1;
    }
    if let Some(name) = hostname.filter(|n| !n.is_empty())
        && let Err(e) = nix::unistd::sethostname(name)
    {
        eprintln!("berth-pause: setting the hostname to {name:?}: {e}");
        return 1;
    }
    let host_pid = std::fs::read_link("/proc/self").map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    {
        let mut out = std::io::stdout().lock();
        if writeln!(out, "{host_pid}").and_then(|_| out.flush()).is_err() {
            return 1;
        }
    }
    loop {
        match signals.wait() {
            Ok(Signal::SIGCHLD) => {
                while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                    if status == nix::sys::wait::WaitStatus::StillAlive {
                        break;
                    }
                }
            }
            Ok(_) => return 0,
            Err(_) => continue,
        }
    }
}
