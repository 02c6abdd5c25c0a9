//! Child daemons (registry, etcd) that die with the test process: free loopback ports, a log
//! file, and a shell watchdog that kills the daemon when our end of its stdin closes.

use std::io::Write;
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
    log: PathBuf,
}

impl Daemon {
    /// Starts `bin args…` with stdout and stderr appended to `log`. When the test process dies
    /// (stdin EOF without a "stop" line), the watchdog also deletes `cleanup`: the daemon's temp
    /// dir, whose `TempDir` is never dropped when the daemon lives in a `static`.
    pub fn spawn(bin: &str, args: &[String], log: &Path, cleanup: Option<&Path>) -> Daemon {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("daemon log file");
        let child = Command::new("sh")
            .arg("-c")
            .arg(r#""$0" "$@" & pid=$!; read how; kill $pid 2>/dev/null; wait $pid; [ -n "$how" ] || [ -z "$CLEANUP" ] || rm -rf "$CLEANUP""#)
            .arg(bin)
            .args(args)
            .env("CLEANUP", cleanup.map(|p| p.as_os_str()).unwrap_or_default())
            .stdin(Stdio::piped())
            .stdout(out.try_clone().expect("daemon log file"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start {bin}: {e}"));
        let mut child = child;
        let stdin = child.stdin.take();
        Daemon { child, stdin, log: log.to_owned() }
    }

    /// `Some(status)` once the wrapper (and so the daemon) has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops the daemon and waits for it.
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
