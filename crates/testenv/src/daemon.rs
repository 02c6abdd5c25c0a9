//! Child daemons (registry, etcd, containerd) that die with the test process: free loopback
//! ports, a log file, and a shell watchdog that kills the daemon when our end of its stdin closes
//! and then runs the daemon's cleanup.

use std::io::{BufRead as _, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

/// A free TCP port on 127.0.0.1 (bound and released; the daemon binds it right after).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

/// A running daemon. The shell wrapper kills it when stdin reaches EOF, which happens on `Drop`
/// and also when the test process dies without running `Drop` (e.g. a daemon kept in a `static`).
pub struct Daemon {
    child: Child,
    stdin: Option<ChildStdin>,
    /// The daemon's own pid (the wrapper's child).
    pid: u32,
    log: PathBuf,
}

/// The watchdog: starts the daemon with its output appended to `$LOG`, prints its pid, waits for
/// a line (or EOF) on stdin, stops it, runs `$AFTER_EXIT` if set, and on EOF alone (the test
/// process died) also deletes `$CLEANUP`.
const WATCHDOG: &str = r#""$0" "$@" >>"$LOG" 2>&1 & pid=$!; echo $pid
read how; kill $pid 2>/dev/null; wait $pid
[ -z "$AFTER_EXIT" ] || sh "$AFTER_EXIT" >>"$LOG" 2>&1
[ -n "$how" ] || [ -z "$CLEANUP" ] || rm -rf "$CLEANUP""#;

impl Daemon {
    /// Starts `bin args…` with stdout and stderr appended to `log`. When the test process dies
    /// (stdin EOF without a "stop" line), the watchdog also deletes `cleanup`: the daemon's temp
    /// dir, whose `TempDir` is never dropped when the daemon lives in a `static`.
    pub fn spawn(bin: &str, args: &[String], log: &Path, cleanup: Option<&Path>) -> Daemon {
        Daemon::spawn_with_after_exit(bin, args, log, cleanup, None)
    }

    /// As [`Daemon::spawn`], and once the daemon has exited, however it was stopped, the watchdog
    /// runs the shell script at `after_exit` (output to `log`), before deleting `cleanup`: for
    /// what a daemon leaves behind on the host (containers, mounts, links).
    pub fn spawn_with_after_exit(
        bin: &str,
        args: &[String],
        log: &Path,
        cleanup: Option<&Path>,
        after_exit: Option<&Path>,
    ) -> Daemon {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("daemon log file");
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg(bin)
            .args(args)
            .env("LOG", log)
            .env("CLEANUP", cleanup.map(|p| p.as_os_str()).unwrap_or_default())
            .env("AFTER_EXIT", after_exit.map(|p| p.as_os_str()).unwrap_or_default())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start {bin}: {e}"));
        let stdin = child.stdin.take();
        let mut line = String::new();
        let stdout = child.stdout.take().expect("watchdog stdout");
        BufReader::new(stdout).read_line(&mut line).expect("read the daemon's pid");
        let pid = line.trim().parse().unwrap_or_else(|_| panic!("the watchdog of {bin} printed no pid: {line:?}"));
        Daemon { child, stdin, pid, log: log.to_owned() }
    }

    /// The daemon's pid (not its watchdog's), e.g. to read its memory use.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the daemon itself still runs (its watchdog reaps it only when stopped).
    pub fn running(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
            .unwrap_or(false)
    }

    /// `Some(status)` once the wrapper (and so the daemon) has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `lines` lines of the log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Stops the daemon and waits for it (and for the after-exit script).
    pub fn stop(&mut self) {
        // An orderly stop leaves the temp dir to its owner (TempDir, or a retry with a new port).
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"stop\n");
        }
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Panics unless `bin` exists: tests must fail, not skip, when the environment is incomplete.
pub fn require_binary(bin: &str, package: &str) {
    assert!(
        Path::new(bin).exists(),
        "berth-testenv needs {bin}, which is missing; install the Debian package `{package}` \
         (scripts/install-deps.sh does)"
    );
}
