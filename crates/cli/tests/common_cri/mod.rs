//! Test harness for the CRI side: the real `berth runtime` binary on a temporary socket and root
//! that survive restarts (and `kill -9`), and `berth cri …` run against it, in the foreground or
//! in the background.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A `berth runtime` on a temp dir: `runtime.toml`, `run/runtime.sock`, `root/` (images under
/// `root/images`), and one log file per start (`runtime-<n>.log`).
pub struct Runtime {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    starts: usize,
    env: Vec<(String, String)>,
    /// The bridge of a runtime that runs pods; it goes once no runtime of this process uses it.
    bridge: Option<berth_testenv::cni::BridgeLease>,
}

impl Runtime {
    /// Handler `runc` (linux/amd64, the default); each of `insecure_hosts` marked insecure.
    pub fn start(insecure_hosts: &[&str]) -> Runtime {
        Self::start_with_env(insecure_hosts, &[])
    }

    /// As [`Self::start`], with extra environment for the runtime (e.g. `BERTH_LOG`).
    pub fn start_with_env(insecure_hosts: &[&str], env: &[(&str, &str)]) -> Runtime {
        let dir = tempfile::tempdir().unwrap();
        let mut config = format!(
            "socket = {socket:?}\nroot = {root:?}\ndefault_handler = \"runc\"\n\
             [handlers.runc]\nbinary = \"runc\"\nplatform = \"linux/amd64\"\n",
            socket = dir.path().join("run/runtime.sock"),
            root = dir.path().join("root"),
        );
        for host in insecure_hosts {
            config.push_str(&format!("[registries.\"{host}\"]\ninsecure = true\n"));
        }
        std::fs::write(dir.path().join("runtime.toml"), config).unwrap();
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut rt = Runtime { child: None, dir, starts: 0, env, bridge: None };
        rt.spawn();
        rt
    }

    /// A runtime that runs pods: handlers `runc` (the default) and `gvisor` (runsc on ptrace, the
    /// pod's netns as its network), each with its own state root under the temp dir; a CNI conf
    /// dir of its own holding one bridge network `bridge` on `subnet` (IPAM state under the temp
    /// dir too); `insecure_host` marked insecure.
    pub fn start_with_pods(insecure_host: &str, bridge: &str, subnet: &str) -> Runtime {
        let dir = tempfile::tempdir().unwrap();
        let cni_dir = dir.path().join("cni");
        std::fs::create_dir_all(&cni_dir).unwrap();
        let conflist = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": bridge,
            "plugins": [{
                "type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": false,
                "ipam": { "type": "host-local", "ranges": [[{ "subnet": subnet }]],
                          "routes": [{ "dst": "0.0.0.0/0" }], "dataDir": dir.path().join("ipam") }
            }]
        });
        std::fs::write(cni_dir.join("10-test.conflist"), conflist.to_string()).unwrap();
        let config = format!(
            r#"socket = {socket:?}
root = {root:?}
default_handler = "runc"
[handlers.runc]
binary = "runc"
root = {runc_root:?}
[handlers.gvisor]
binary = "runsc"
args = ["--platform=ptrace", "--network=host"]
root = {runsc_root:?}
[cni]
conf_dir = {cni_dir:?}
[registries."{insecure_host}"]
insecure = true
"#,
            socket = dir.path().join("run/runtime.sock"),
            root = dir.path().join("root"),
            runc_root = dir.path().join("runc"),
            runsc_root = dir.path().join("runsc"),
        );
        std::fs::write(dir.path().join("runtime.toml"), config).unwrap();
        let bridge = Some(berth_testenv::cni::BridgeLease::take(bridge));
        let mut rt = Runtime { child: None, dir, starts: 0, env: Vec::new(), bridge };
        rt.spawn();
        rt
    }

    /// Starts the binary on the same config and root and waits for its socket.
    fn spawn(&mut self) {
        assert!(self.child.is_none(), "runtime already running");
        self.starts += 1;
        let log = std::fs::File::create(self.log_path()).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_berth"))
            .arg("runtime")
            .arg("--config")
            .arg(self.dir.path().join("runtime.toml"))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        // A socket left by a killed runtime is replaced once the new one listens: wait until
        // it answers, not merely exists.
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("berth runtime exited with {status}:\n{}", self.log());
            }
            if std::os::unix::net::UnixStream::connect(self.socket()).is_ok() {
                return;
            }
            assert!(Instant::now() < deadline, "runtime not answering after 30s:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: a crash, no cleanup of any kind.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            let status = child.wait().unwrap();
            assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9), "{status}");
        }
    }

    /// Starts the runtime again on the same root (after [`Self::kill9`] or [`Self::stop`]).
    pub fn restart(&mut self) {
        self.spawn();
    }

    /// SIGTERM and a clean exit.
    pub fn stop(&mut self) {
        let mut child = self.child.take().expect("runtime running");
        let pid = child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let status = child.wait().unwrap();
        assert!(status.success(), "berth runtime exited with {status}:\n{}", self.log());
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("run/runtime.sock")
    }

    /// A gRPC channel to the runtime's socket, for tests that talk CRI directly.
    pub async fn channel(&self) -> tonic::transport::Channel {
        let path = self.socket();
        tonic::transport::Endpoint::from_static("http://localhost")
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .unwrap()
    }

    /// The image store root (`<root>/images`).
    pub fn images_root(&self) -> PathBuf {
        self.dir.path().join("root/images")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join(format!("runtime-{}.log", self.starts))
    }

    /// The log of the current (or last) start.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Every start's log, in order, with a header each.
    pub fn all_logs(&self) -> String {
        (1..=self.starts)
            .map(|n| {
                let log = std::fs::read_to_string(self.dir.path().join(format!("runtime-{n}.log")));
                format!("--- runtime start {n} ---\n{}", log.unwrap_or_default())
            })
            .collect()
    }

    fn cri_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_berth"));
        cmd.arg("cri")
            .args(args)
            .env("CONTAINER_RUNTIME_ENDPOINT", format!("unix://{}", self.socket().display()))
            .env_remove("IMAGE_SERVICE_ENDPOINT");
        cmd
    }

    /// `berth cri ARGS`, waited for.
    pub fn cri(&self, args: &[&str]) -> Output {
        self.cri_command(args).output().unwrap()
    }

    /// `berth cri ARGS` in the background, stdout and stderr captured.
    pub fn cri_spawn(&self, args: &[&str]) -> Child {
        self.cri_command(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
    }

    /// `berth cri ARGS`, asserted to succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cri(args);
        assert!(
            out.status.success(),
            "berth cri {args:?} failed: {}\nruntime logs:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.all_logs()
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

/// On a panic, stops and removes every pod of a runtime, starting it again on its config if it is
/// down, so that a failed test leaves no containers, mounts or netns behind (a plain drop would
/// leave them: containers outlive the runtime, and the temp dir cannot be removed under mounts).
/// Declare it after the [`Runtime`], so that it is dropped first.
pub struct RemovePodsOnPanic {
    config: PathBuf,
    socket: PathBuf,
}

impl RemovePodsOnPanic {
    pub fn new(rt: &Runtime) -> Self {
        RemovePodsOnPanic { config: rt.dir.path().join("runtime.toml"), socket: rt.socket() }
    }

    fn cri(&self, args: &[&str]) -> Option<String> {
        let out = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["cri", "-t", "60s"])
            .args(args)
            .env("CONTAINER_RUNTIME_ENDPOINT", format!("unix://{}", self.socket.display()))
            .output()
            .ok()?;
        if !out.status.success() {
            eprintln!("cleanup: berth cri {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for RemovePodsOnPanic {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        // The runtime's side of the failure, before the temp dir goes.
        let dir = self.config.parent().unwrap();
        let mut logs: Vec<PathBuf> =
            std::fs::read_dir(dir).map(|entries| entries.flatten().map(|e| e.path()).collect()).unwrap_or_default();
        logs.retain(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("runtime-")));
        logs.sort();
        for log in logs {
            eprintln!("--- {} ---\n{}", log.display(), std::fs::read_to_string(&log).unwrap_or_default());
        }
        let mut started = None;
        if std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            let child = Command::new(env!("CARGO_BIN_EXE_berth"))
                .arg("runtime")
                .arg("--config")
                .arg(&self.config)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn();
            let Ok(child) = child else { return };
            started = Some(child);
            let deadline = Instant::now() + Duration::from_secs(30);
            while std::os::unix::net::UnixStream::connect(&self.socket).is_err() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        for pod in self.cri(&["pods", "-q"]).unwrap_or_default().split_whitespace() {
            self.cri(&["stopp", pod]);
            self.cri(&["rmp", pod]);
        }
        if let Some(mut child) = started {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let _ = child.wait();
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Only once the runtime is gone.
        self.bridge.take();
    }
}

/// Builds `berth-monitor` (cargo is quick when it is fresh) beside the `berth` binary, where
/// `berth runtime` looks for it first: the runtime verbs need it to run pods and containers.
pub fn ensure_monitor() {
    berth_testenv::monitor::monitor_binary_in(Path::new(env!("CARGO_BIN_EXE_berth")).parent().unwrap());
}

/// Table rows as (IMAGE, TAG, IMAGE ID, RUNTIME, SIZE), header skipped.
pub fn rows(table: &str) -> Vec<Vec<String>> {
    table.lines().skip(1).map(|l| l.split_whitespace().map(String::from).collect()).collect()
}

/// Regular files directly in `dir` with their sizes, sorted by name (empty if `dir` is missing).
pub fn files_with_sizes(dir: &Path) -> Vec<(String, u64)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<(String, u64)> = entries
        .flatten()
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            meta.is_file().then(|| (e.file_name().to_string_lossy().into_owned(), meta.len()))
        })
        .collect();
    files.sort();
    files
}

/// `sha256:<hex>` of a file, by coreutils' `sha256sum` (fast even in a debug build).
pub fn sha256_file(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(out.status.success(), "sha256sum {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    format!("sha256:{}", text.split_whitespace().next().unwrap())
}
