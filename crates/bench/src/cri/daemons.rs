//! The release `berth runtime` under test as a child process of the bench, with a config, state,
//! socket and network of this run only. containerd, the other runtime, is `berth_testenv::Containerd`.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

use anyhow::{Context as _, ensure};

use super::net::{self, Network};

pub const BERTH_NETWORK: Network = Network { name: "berth-bench", bridge: "benchberth0", subnet: "10.196.0.0/24" };
pub const CONTAINERD_NETWORK: Network =
    Network { name: "containerd-bench", bridge: "benchctd0", subnet: "10.197.0.0/24" };

/// A daemon under a shell that SIGTERMs it when the shell's stdin closes: on drop, and also when
/// the bench dies without running drop.
pub struct Daemon {
    shell: Child,
    stdin: Option<ChildStdin>,
    /// The daemon's own pid (not the shell's), for its RSS.
    pub pid: u32,
    pub log: PathBuf,
}

impl Daemon {
    pub fn spawn(program: &Path, args: &[String], log: &Path) -> anyhow::Result<Self> {
        let mut shell = Command::new("sh")
            .arg("-c")
            .arg(r#""$0" "$@" >>"$LOG" 2>&1 & pid=$!; echo $pid; read _ignored; kill $pid; wait $pid"#)
            .arg(program)
            .args(args)
            .env("LOG", log)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        let stdout = shell.stdout.take().context("shell stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let pid = line.trim().parse().with_context(|| format!("the pid of {}: {line:?}", program.display()))?;
        Ok(Self { stdin: shell.stdin.take(), shell, pid, log: log.to_owned() })
    }

    /// The last lines of the daemon's log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    pub fn stop(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"stop\n");
        }
        let _ = self.shell.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `berth runtime` with handlers runc, crun and gvisor, its own root, socket and bridge.
pub fn start_berth(binary: &Path, dir: &Path, registry_host: &str) -> anyhow::Result<(Daemon, PathBuf)> {
    ensure!(
        binary.exists(),
        "no berth binary at {} (cargo build --release -p berth -p berth-monitor)",
        binary.display()
    );
    let monitor = binary.with_file_name("berth-monitor");
    ensure!(monitor.exists(), "no berth-monitor next to berth at {}", monitor.display());
    let socket = dir.join("run/cri.sock");
    let cni_dir = dir.join("net.d");
    net::write_conflist(&cni_dir, &net::conflist(&BERTH_NETWORK, &dir.join("ipam")))?;
    let config = format!(
        r#"socket = {socket:?}
root = {root:?}
default_handler = "runc"
[handlers.runc]
binary = "runc"
root = {runc:?}
[handlers.crun]
binary = "crun"
root = {crun:?}
[handlers.gvisor]
binary = "runsc"
args = ["--platform=ptrace", "--network=host"]
root = {runsc:?}
[cni]
conf_dir = {cni_dir:?}
[registries."{registry_host}"]
insecure = true
"#,
        root = dir.join("root"),
        runc = dir.join("oci/runc"),
        crun = dir.join("oci/crun"),
        runsc = dir.join("oci/runsc"),
    );
    let config_path = dir.join("runtime.toml");
    std::fs::write(&config_path, config)?;
    let args = vec!["runtime".to_owned(), "--config".to_owned(), config_path.to_string_lossy().into_owned()];
    let daemon = Daemon::spawn(binary, &args, &dir.join("berth-runtime.log"))?;
    Ok((daemon, socket))
}

/// Lazily unmounts whatever is still mounted under `dir` (deepest first), so that deleting the
/// run's temp dir never descends into a rootfs or a netns left by a failed run.
pub fn unmount_under(dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else { return };
    let mut points: Vec<&str> =
        mounts.lines().filter_map(|l| l.split(' ').nth(4)).filter(|p| Path::new(p).starts_with(dir)).collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let _ = net::run("umount", &["-l", point]);
    }
}
