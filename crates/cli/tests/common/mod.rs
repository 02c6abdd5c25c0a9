//! Test harness: starts the real `berth server` binary in a temporary data dir on a free port and
//! runs the real `kubectl` against it.
#![allow(dead_code)]

use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub port: u16,
    extra: Vec<String>,
}

/// A port free on every address: a server bound to loopback also listens on the host's address.
pub fn free_port() -> u16 {
    TcpListener::bind("0.0.0.0:0").unwrap().local_addr().unwrap().port()
}

impl Server {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut s =
            Server { child: None, dir, port: free_port(), extra: extra.iter().map(|s| s.to_string()).collect() };
        s.spawn();
        s
    }

    /// A second server of `first`'s cluster: same CA, service-account signing key and admin
    /// token, as every API server of one cluster must have.
    pub fn start_sharing(first: &Server, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut s =
            Server { child: None, dir, port: free_port(), extra: extra.iter().map(|s| s.to_string()).collect() };
        std::fs::create_dir_all(s.data_dir().join("pki")).unwrap();
        for file in ["pki/ca.crt", "pki/ca.key", "pki/sa.key", "admin.token"] {
            std::fs::copy(first.data_dir().join(file), s.data_dir().join(file)).unwrap();
        }
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join("server.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["server", "--data-dir"])
            .arg(self.data_dir())
            .args(["--secure-port", &self.port.to_string(), "--compaction-interval-seconds", "3600"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting berth server");
        self.child = Some(child);
        self.wait_ready();
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.data_dir().join("admin.kubeconfig")
    }

    pub fn token(&self) -> String {
        std::fs::read_to_string(self.data_dir().join("admin.token")).unwrap().trim().to_string()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// Ready, and (when its controllers run) with the `default` ServiceAccount the
    /// ServiceAccount admission plugin wants for every pod of the `default` namespace.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let controllers = !self.extra.iter().any(|a| a.starts_with("--controllers"));
        let mut ready = false;
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("berth server exited with {status}:\n{}", self.log());
            }
            ready =
                ready || (self.kubeconfig().exists() && self.kubectl(&["get", "--raw", "/readyz"]).status.success());
            if ready && (!controllers || self.kubectl(&["get", "serviceaccount", "default"]).status.success()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("berth server did not become ready:\n{}", self.log());
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl").env("KUBECONFIG", self.kubeconfig()).args(args).output().expect("running kubectl")
    }

    /// Runs kubectl and asserts success; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Runs kubectl with `input` on stdin.
    pub fn kubectl_stdin(&self, args: &[&str], input: &str) -> Output {
        let mut child = Command::new("kubectl")
            .env("KUBECONFIG", self.kubeconfig())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running kubectl");
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    }

    pub fn apply(&self, yaml: &str) -> Output {
        self.kubectl_stdin(&["apply", "-f", "-"], yaml)
    }

    /// The server's process id, e.g. to read its memory.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the server runs").id()
    }

    /// SIGKILL, as a crash.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    pub async fn client(&self) -> kube::Client {
        let kc = kube::config::Kubeconfig::read_from(self.kubeconfig()).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
        kube::Client::try_from(cfg).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A real etcd (Debian's /usr/bin/etcd) on free loopback ports, killed on drop.
pub struct Etcd {
    child: Child,
    _dir: tempfile::TempDir,
    pub endpoint: String,
}

impl Etcd {
    pub fn start() -> Self {
        let bin = std::env::var("BERTH_ETCD").unwrap_or_else(|_| "/usr/bin/etcd".into());
        assert!(std::path::Path::new(&bin).exists(), "etcd not found at {bin}: run scripts/install-deps.sh");
        let dir = tempfile::tempdir().unwrap();
        let (client, peer) = (free_port(), free_port());
        let endpoint = format!("http://127.0.0.1:{client}");
        let child = Command::new(bin)
            .args(["--name", "berth-test", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &endpoint, "--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-cluster", &format!("berth-test=http://127.0.0.1:{peer}")])
            .args(berth_testenv::etcd::PROGRESS_NOTIFY_ARGS)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting etcd");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = Command::new("curl")
                .args(["-sf", &format!("{endpoint}/health")])
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                break;
            }
            assert!(Instant::now() < deadline, "etcd did not become healthy");
            std::thread::sleep(Duration::from_millis(100));
        }
        Etcd { child, _dir: dir, endpoint }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
