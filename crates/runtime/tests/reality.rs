//! `HostReality` against a real runc container under a real `berth-monitor` (root and
//! `/bin/busybox` required: the test fails without them, as integration tests here do).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::thread::sleep;
use std::time::{Duration, Instant};

use berth_monitor::{LaunchOptions, is_alive, launch, read_exit, read_monitor_pid};
use berth_oci::OciRuntime;
use berth_oci::runtime::ProcessSpawner;
use berth_runtime::reality::{HostReality, monitor_dir};
use berth_runtime::state::{ContainerRecord, Observed, Reality, new_id};
use serde_json::json;

fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

/// A busybox bundle running `sleep`, its runc root and the store root in one temporary directory.
struct Fixture {
    dir: tempfile::TempDir,
    id: String,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::Builder::new().prefix("berth-reality-").tempdir().unwrap();
        berth_testenv::bundle::write_busybox_bundle(
            &dir.path().join("bundle"),
            &["sleep", "1000"],
            "reality-test",
            json!({}),
        );
        Fixture { dir, id: new_id() }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn runc_root(&self) -> PathBuf {
        self.root().join("runc")
    }

    fn runc(&self, args: &[&str]) {
        let out = Command::new("runc").arg("--root").arg(self.runc_root()).args(args).output().unwrap();
        assert!(out.status.success(), "runc {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = Command::new("runc").arg("--root").arg(self.runc_root()).args(["delete", "-f", &self.id]).output();
        if let Ok(Some(pid)) = read_monitor_pid(&monitor_dir(self.root(), &self.id))
            && is_alive(pid)
        {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
}

fn wait_for<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if Instant::now() > deadline {
            return None;
        }
        sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_runc_container_is_seen_created_running_then_exited_137_after_sigkill() {
    assert!(is_root(), "this test needs root");
    assert!(Path::new("/bin/busybox").exists(), "this test needs /bin/busybox (busybox-static)");
    let monitor = berth_testenv::monitor::monitor_binary();
    let f = Fixture::new();
    let state_dir = monitor_dir(f.root(), &f.id);
    let pid_file = state_dir.join("container.pid");
    let handle = launch(&LaunchOptions {
        monitor_binary: monitor,
        id: f.id.clone(),
        state_dir: state_dir.clone(),
        log_path: None,
        pid_file: pid_file.clone(),
        create_command: vec![
            "runc".into(),
            "--root".into(),
            f.runc_root().into(),
            "create".into(),
            "--bundle".into(),
            f.root().join("bundle").into(),
            "--pid-file".into(),
            pid_file.into(),
            f.id.clone().into(),
        ],
        stdin: false,
        stdin_once: false,
        attach_socket: None,
        console_socket: None,
    })
    .expect("the monitor creates the container");

    let runc = OciRuntime::new("runc", Arc::new(ProcessSpawner)).with_root(f.runc_root());
    let reality = HostReality::with_runtimes(f.root(), [("runc".to_string(), runc)]);
    let mut record = ContainerRecord::default();
    record.id = f.id.clone();
    record.handler = "runc".into();

    assert_eq!(reality.container_status(&record), Observed::Created { pid: Some(handle.container_pid) });
    f.runc(&["start", &f.id]);
    assert_eq!(reality.container_status(&record), Observed::Running { pid: handle.container_pid });

    f.runc(&["kill", &f.id, "9"]);
    wait_for(Duration::from_secs(10), || read_exit(&state_dir).unwrap()).expect("exit.json within 10 s");
    let before = berth_runtime::state::now_ns();
    match reality.container_status(&record) {
        Observed::Exited { exit_code: 137, finished_at, oom_killed: false } => {
            assert!(finished_at > before - 60_000_000_000 && finished_at <= before, "{finished_at} vs {before}");
        }
        other => panic!("expected an exit with 137, got {other:?}"),
    }
}
