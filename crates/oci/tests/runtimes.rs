//! Integration tests (root): real runc, crun and runsc driven through `OciRuntime`, each running a
//! busybox bundle whose `config.json` comes from `spec::container_spec`.
//!
//! A missing runtime binary fails the test. Each runtime keeps its state under
//! `/run/berth-test/oci/<runtime>`, containers live in cgroups under `/berth-test/`, and every
//! test deletes its container and cgroups even when it fails.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use berth_oci::runtime::{CreateOptions, ExecOptions, OciError, OciRuntime, ProcessSpawner, Status};
use berth_oci::spec::{self, ContainerSpec, ImageConfig, Resources, SeccompProfile};
use nix::sys::signal::Signal;

const CGROUP_PARENT: &str = "/berth-test";
const MEMORY_LIMIT: i64 = 64 << 20;

/// How many tests of this binary have a container under `CGROUP_PARENT`: the last one to finish
/// removes the parent, and none removes it while another may be creating a container under it.
static CGROUP_USERS: Mutex<usize> = Mutex::new(0);

fn find_binary(name: &str) -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} is not installed (not on PATH nor in /usr/sbin, /usr/bin): run scripts/install-deps.sh")
        })
}

/// crun refuses this host's hybrid cgroup layout until the repo's fix has run (idempotent).
fn fix_crun_hybrid() {
    static FIX: Once = Once::new();
    FIX.call_once(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fix-crun-hybrid.sh");
        let out = std::process::Command::new(&script).output().expect("run scripts/fix-crun-hybrid.sh");
        assert!(out.status.success(), "fix-crun-hybrid.sh failed: {}", String::from_utf8_lossy(&out.stderr));
    });
}

fn runtime(name: &str) -> OciRuntime {
    let binary = find_binary(name);
    let rt = OciRuntime::new(binary, Arc::new(ProcessSpawner)).with_root(format!("/run/berth-test/oci/{name}"));
    match name {
        "crun" => {
            fix_crun_hybrid();
            rt
        }
        // ptrace is the only platform on this VM kind, and gVisor's netstack refuses to start in
        // a namespace it takes for the host's, so the sandbox gets loopback only.
        "runsc" => rt.with_global_args(["--platform=ptrace", "--network=none"]),
        _ => rt,
    }
}

/// A busybox rootfs (the host's static busybox with every applet hard-linked) and its bundle.
struct Bundle {
    dir: tempfile::TempDir,
}

impl Bundle {
    fn new(id: &str, cmd: &[&str]) -> Bundle {
        let dir = tempfile::Builder::new().prefix("berth-oci-").tempdir().unwrap();
        let rootfs = dir.path().join("rootfs");
        for d in ["bin", "etc", "proc", "sys", "dev", "tmp"] {
            std::fs::create_dir_all(rootfs.join(d)).unwrap();
        }
        let busybox = find_binary("busybox");
        std::fs::copy(&busybox, rootfs.join("bin/busybox")).unwrap();
        let list = std::process::Command::new(&busybox).arg("--list").output().unwrap();
        for applet in String::from_utf8_lossy(&list.stdout).lines().filter(|a| !a.is_empty() && *a != "busybox") {
            std::fs::hard_link(rootfs.join("bin/busybox"), rootfs.join("bin").join(applet)).unwrap();
        }
        std::fs::write(
            rootfs.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n",
        )
        .unwrap();
        std::fs::write(rootfs.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n").unwrap();

        let c = ContainerSpec {
            id: id.to_owned(),
            rootfs: rootfs.clone(),
            image: ImageConfig { cmd: cmd.iter().map(|s| s.to_string()).collect(), ..Default::default() },
            hostname: Some("oci-test".into()),
            cgroup_parent: Some(CGROUP_PARENT.into()),
            seccomp: SeccompProfile::RuntimeDefault,
            no_new_privileges: true,
            resources: Resources {
                memory_limit_in_bytes: MEMORY_LIMIT,
                cpu_shares: 512,
                oom_score_adj: -998,
                ..Default::default()
            },
            ..Default::default()
        };
        let spec = spec::container_spec(&c).unwrap();
        spec.save(dir.path().join("config.json")).unwrap();
        // The process of `exec`: the container's, with another command.
        let mut process = spec.process().clone().unwrap();
        process.set_args(Some(vec!["echo".into(), "hi".into()]));
        std::fs::write(dir.path().join("exec.json"), serde_json::to_vec(&process).unwrap()).unwrap();
        Bundle { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Deletes the container and its cgroups when the test ends, passed or failed.
struct Cleanup<'a> {
    rt: &'a OciRuntime,
    id: String,
}

impl<'a> Cleanup<'a> {
    fn new(rt: &'a OciRuntime, id: &str) -> Self {
        *CGROUP_USERS.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        Cleanup { rt, id: id.to_owned() }
    }
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = self.rt.delete(&self.id, true);
        let mut users = CGROUP_USERS.lock().unwrap_or_else(|e| e.into_inner());
        *users -= 1;
        for controller in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
            let parent = controller.path().join(CGROUP_PARENT.trim_start_matches('/'));
            let _ = std::fs::remove_dir(parent.join(&self.id));
            if *users == 0 {
                let _ = std::fs::remove_dir(parent);
            }
        }
    }
}

fn unique_id(runtime: &str, what: &str) -> String {
    format!("berth-oci-{runtime}-{what}-{}", std::process::id())
}

fn wait_for(rt: &OciRuntime, id: &str, status: Status) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = rt.state(id).unwrap();
        if state.status == status {
            return;
        }
        assert!(Instant::now() < deadline, "{id} is still {} after 10 s, expected {status}", state.status);
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn lifecycle(name: &str) {
    let rt = runtime(name);
    let id = unique_id(name, "life");
    let bundle = Bundle::new(&id, &["sleep", "3600"]);
    let _cleanup = Cleanup::new(&rt, &id);

    rt.create(&id, &CreateOptions::new(bundle.path()).pid_file(bundle.path().join("pid"))).unwrap();
    let created = rt.state(&id).unwrap();
    assert_eq!(created.status, Status::Created);
    assert_eq!(created.bundle, bundle.path());
    let pid: u32 = std::fs::read_to_string(bundle.path().join("pid")).unwrap().trim().parse().unwrap();
    assert_eq!(created.pid, Some(pid));
    assert!(rt.list().unwrap().iter().any(|s| s.id == id && s.status == Status::Created));

    rt.start(&id).unwrap();
    wait_for(&rt, &id, Status::Running);
    if name != "runsc" {
        // runc and crun put the container itself in the cgroup; runsc puts its sandbox there.
        let limit = format!("/sys/fs/cgroup/memory{CGROUP_PARENT}/{id}/memory.limit_in_bytes");
        assert_eq!(std::fs::read_to_string(&limit).unwrap().trim(), MEMORY_LIMIT.to_string(), "{limit}");
        let oom = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap();
        assert_eq!(oom.trim(), "0", "-998 is clamped to this process's score");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        assert!(status.contains("\nSeccomp:\t2\n"), "runtime/default seccomp is in force:\n{status}");
        assert!(status.contains("\nNoNewPrivs:\t1\n"), "{status}");
    }

    rt.kill(&id, Signal::SIGKILL, false).unwrap();
    wait_for(&rt, &id, Status::Stopped);
    rt.delete(&id, false).unwrap();
    match rt.state(&id) {
        Err(OciError::NotFound { id: missing }) => assert_eq!(missing, id),
        other => panic!("state after delete: {other:?}"),
    }
    assert!(!rt.list().unwrap().iter().any(|s| s.id == id));
    assert!(matches!(rt.kill(&id, Signal::SIGKILL, false), Err(OciError::NotFound { .. })));
}

fn exec_echo(name: &str) {
    let rt = runtime(name);
    let id = unique_id(name, "exec");
    let bundle = Bundle::new(&id, &["sleep", "3600"]);
    let _cleanup = Cleanup::new(&rt, &id);

    rt.create(&id, &CreateOptions::new(bundle.path())).unwrap();
    rt.start(&id).unwrap();
    wait_for(&rt, &id, Status::Running);
    let out = rt.exec(&id, &ExecOptions::new(bundle.path().join("exec.json"))).unwrap();
    assert!(out.status.success(), "exec failed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");

    rt.kill(&id, Signal::SIGKILL, true).unwrap();
    wait_for(&rt, &id, Status::Stopped);
    rt.delete(&id, false).unwrap();
}

#[test]
fn runc_runs_a_container_from_create_to_delete() {
    lifecycle("runc");
}

#[test]
fn crun_runs_a_container_from_create_to_delete() {
    lifecycle("crun");
}

#[test]
fn runsc_runs_a_container_from_create_to_delete() {
    lifecycle("runsc");
}

#[test]
fn runc_execs_echo_into_a_running_container() {
    exec_echo("runc");
}

#[test]
fn crun_execs_echo_into_a_running_container() {
    exec_echo("crun");
}

#[test]
fn runsc_execs_echo_into_a_running_container() {
    exec_echo("runsc");
}

#[test]
fn each_runtime_reports_its_version_and_features_where_it_has_them() {
    for name in ["runc", "crun", "runsc"] {
        let v = runtime(name).version().unwrap();
        assert_eq!(v.name, name, "{v:?}");
        assert!(!v.version.is_empty(), "{v:?}");
    }
    let runc = runtime("runc").features().unwrap().expect("runc 1.1 has `features`");
    assert!(!runc.oci_version_max().is_empty());
    // crun 1.8 and this runsc have no `features`; a newer one may.
    runtime("crun").features().unwrap();
    runtime("runsc").features().unwrap();
}

#[test]
fn a_bundle_that_cannot_run_fails_create_with_the_runtimes_message() {
    for name in ["runc", "crun"] {
        let rt = runtime(name);
        let id = unique_id(name, "bad");
        let bundle = Bundle::new(&id, &["/no/such/binary"]);
        let _cleanup = Cleanup::new(&rt, &id);
        std::fs::remove_file(bundle.path().join("config.json")).unwrap();
        match rt.create(&id, &CreateOptions::new(bundle.path())) {
            Err(OciError::CommandFailed { stderr, .. }) => assert!(stderr.contains("config.json"), "{name}: {stderr}"),
            other => panic!("{name}: {other:?}"),
        }
    }
}
