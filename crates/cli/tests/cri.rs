//! End to end: the real `berth runtime` binary on a temporary socket, a real registry on
//! loopback, and `berth cri pull/images/inspecti/rmi/version` against them as a user runs them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Runtime {
    child: Child,
    dir: tempfile::TempDir,
}

impl Runtime {
    /// `runc` sees linux/amd64 and `gvisor` linux/arm64/v8, whatever the host is.
    fn start(registry_host: &str) -> Runtime {
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            r#"socket = {socket:?}
root = {root:?}
default_handler = "runc"
[handlers.runc]
binary = "runc"
platform = "linux/amd64"
[handlers.gvisor]
binary = "runsc"
args = ["--platform=ptrace", "--network=host"]
platform = "linux/arm64/v8"
[registries."{registry_host}"]
insecure = true
"#,
            socket = dir.path().join("run/runtime.sock"),
            root = dir.path().join("root"),
        );
        std::fs::write(dir.path().join("runtime.toml"), config).unwrap();
        let log = std::fs::File::create(dir.path().join("runtime.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_berth"))
            .arg("runtime")
            .arg("--config")
            .arg(dir.path().join("runtime.toml"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut rt = Runtime { child, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !rt.socket().exists() {
            if let Some(status) = rt.child.try_wait().unwrap() {
                panic!("berth runtime exited with {status}:\n{}", rt.log());
            }
            assert!(Instant::now() < deadline, "no socket after 30s:\n{}", rt.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        rt
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("run/runtime.sock")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("runtime.log")).unwrap_or_default()
    }

    /// `berth cri ARGS` against this runtime (the endpoint from the environment, as users set it).
    fn cri(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_berth"))
            .arg("cri")
            .args(args)
            .env("CONTAINER_RUNTIME_ENDPOINT", format!("unix://{}", self.socket().display()))
            .env_remove("IMAGE_SERVICE_ENDPOINT")
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cri(args);
        assert!(
            out.status.success(),
            "berth cri {args:?} failed: {}\nruntime log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn stop(mut self) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "berth runtime exited with {status}:\n{}", self.log());
        assert!(!self.socket().exists(), "socket removed on exit");
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Table rows as (IMAGE, TAG, IMAGE ID, RUNTIME, SIZE), header skipped.
fn rows(table: &str) -> Vec<Vec<String>> {
    table.lines().skip(1).map(|l| l.split_whitespace().map(String::from).collect()).collect()
}

fn socket_mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn pull_for_two_handlers_lists_both_and_rmi_removes_one() {
    let registry = berth_testenv::Registry::start();
    let set = registry.push_standard_set().await;
    let reference = set.multi.reference.clone();
    let (repo, tag) = reference.rsplit_once(':').unwrap();
    let rt = Runtime::start(registry.host());
    assert_eq!(socket_mode(&rt.socket()), 0o600);

    // Off a terminal: exactly crictl's line.
    let out = rt.ok(&["pull", &reference]);
    let runc_id = out.strip_prefix("Image is up to date for ").and_then(|s| s.strip_suffix('\n')).unwrap().to_string();
    assert!(runc_id.starts_with("sha256:"), "{out}");
    let out = rt.ok(&["pull", "--runtime", "gvisor", &reference]);
    let gvisor_id = out.trim().strip_prefix("Image is up to date for ").unwrap().to_string();
    assert_ne!(runc_id, gvisor_id);

    let table = rt.ok(&["images"]);
    let header: Vec<_> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["IMAGE", "TAG", "IMAGE", "ID", "RUNTIME", "SIZE"]);
    let mut listed: Vec<_> =
        rows(&table).into_iter().map(|r| (r[0].clone(), r[1].clone(), r[2].clone(), r[3].clone())).collect();
    listed.sort_by(|a, b| a.3.cmp(&b.3));
    let short = |id: &str| id.trim_start_matches("sha256:")[..13].to_string();
    assert_eq!(
        listed,
        [
            (repo.to_string(), tag.to_string(), short(&gvisor_id), "gvisor".to_string()),
            (repo.to_string(), tag.to_string(), short(&runc_id), "runc".to_string()),
        ],
        "{table}"
    );
    assert_eq!(rows(&rt.ok(&["images", "--runtime", "gvisor"])).len(), 1);
    assert_eq!(rt.ok(&["images", "-q", "--runtime", "runc"]), format!("{runc_id}\n"));

    let json: serde_json::Value = serde_json::from_str(&rt.ok(&["images", "-o", "json"])).unwrap();
    let images = json["images"].as_array().unwrap();
    assert_eq!(images.len(), 2);
    assert!(images.iter().all(|i| i["size"].is_string() && i["repoTags"][0] == reference.as_str()));

    let inspect: serde_json::Value =
        serde_json::from_str(&rt.ok(&["inspecti", "--runtime", "gvisor", &reference])).unwrap();
    assert_eq!(inspect["status"]["id"], gvisor_id.as_str());
    assert_eq!(inspect["status"]["spec"]["runtimeHandler"], "gvisor");
    assert_eq!(inspect["info"]["platform"]["architecture"], "arm64");
    assert_eq!(inspect["info"]["platform"]["variant"], "v8");
    assert_eq!(inspect["info"]["imageSpec"]["architecture"], "arm64");
    let inspect: serde_json::Value = serde_json::from_str(&rt.ok(&["inspecti", &reference])).unwrap();
    assert_eq!(inspect["status"]["spec"]["runtimeHandler"], "runc");
    assert_eq!(inspect["info"]["platform"]["architecture"], "amd64");

    assert_eq!(rt.ok(&["rmi", "--runtime", "gvisor", &reference]), format!("Deleted: {reference}\n"));
    let left = rows(&rt.ok(&["images"]));
    assert_eq!(left.len(), 1);
    assert_eq!(left[0][3], "runc");
    assert!(rt.ok(&["inspecti", &reference]).contains(&runc_id), "the runc copy is intact");
    let missing = rt.cri(&["rmi", "--runtime", "gvisor", &reference]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no such image"));

    assert_eq!(rt.ok(&["rmi", "--all-runtimes", &reference]), format!("Deleted: {reference}\n"));
    assert!(rows(&rt.ok(&["images"])).is_empty());
    rt.stop();
}

#[tokio::test]
async fn pull_on_a_terminal_streams_progress_and_ends_with_the_crictl_line() {
    let registry = berth_testenv::Registry::start();
    let set = registry.push_standard_set().await;
    let rt = Runtime::start(registry.host());
    // `script` gives the client a pseudo-terminal, as a user's shell does.
    let cmd = format!(
        "{} cri -r unix://{} pull --runtime runc {}",
        env!("CARGO_BIN_EXE_berth"),
        rt.socket().display(),
        set.whiteout.reference
    );
    let out = Command::new("script").args(["-qec", &cmd, "/dev/null"]).env("TERM", "xterm").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", rt.log());
    let layer = &set.whiteout.image.layers[0].digest;
    assert!(text.contains(&layer["sha256:".len().."sha256:".len() + 12]), "no bar for {layer}: {text}");
    // The line follows the bars' escape sequences; it ends the output.
    let id = text.rsplit_once("Image is up to date for ").map(|(_, id)| id.trim());
    assert_eq!(id, Some(set.whiteout.image.config_digest.as_str()), "{text}");
    rt.stop();
}

#[tokio::test]
async fn version_info_and_errors_read_like_crictl() {
    let registry = berth_testenv::Registry::start();
    let rt = Runtime::start(registry.host());
    assert_eq!(
        rt.ok(&["version"]),
        format!(
            "Version:  0.1.0\nRuntimeName:  berth\nRuntimeVersion:  {}\nRuntimeApiVersion:  v1\n",
            env!("CARGO_PKG_VERSION")
        )
    );
    let info: serde_json::Value = serde_json::from_str(&rt.ok(&["info"])).unwrap();
    assert_eq!(info["status"]["conditions"][0]["type"], "RuntimeReady");
    let handlers: Vec<_> = info["runtimeHandlers"].as_array().unwrap().iter().map(|h| h["name"].clone()).collect();
    assert_eq!(handlers, ["", "gvisor", "runc"]);
    assert_eq!(info["config"]["defaultRuntimeName"], "runc");

    let fs: serde_json::Value = serde_json::from_str(&rt.ok(&["imagefsinfo"])).unwrap();
    assert!(fs["status"]["imageFilesystems"][0]["fsId"]["mountpoint"].as_str().unwrap().ends_with("root/images"));

    let out = rt.cri(&["pull", "--runtime", "kata", &registry.reference("busybox:latest")]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("InvalidArgument") && stderr.contains("gvisor, runc"), "{stderr}");

    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["cri", "-r", "unix:///nonexistent/berth.sock", "-t", "1s", "version"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unix:///nonexistent/berth.sock"));
    rt.stop();
}
