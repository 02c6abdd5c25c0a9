//! End to end: the runtime verbs of `berth cri` (runp, create, start, ps, pods, inspect,
//! inspectp, logs, exec, stop, rm, stopp, rmp) as a user runs them, against the real
//! `berth runtime` with runc and a busybox image from a loopback registry. Config files are
//! written as crictl's users write them: the pod in snake_case JSON, the container in
//! camelCase YAML.

mod common_cri;

use std::process::Output;
use std::time::{Duration, Instant};

use berth_testenv::Registry;
use berth_testenv::images::{Format, busybox_image};
use common_cri::{Runtime, rows};
use serde_json::Value;

/// Sandboxes and containers take longer than crictl's 2 s default in a debug build.
const TIMEOUT: [&str; 2] = ["-t", "60s"];

fn cri(rt: &Runtime, args: &[&str]) -> Output {
    rt.cri(&[&TIMEOUT[..], args].concat())
}

fn ok(rt: &Runtime, args: &[&str]) -> String {
    rt.ok(&[&TIMEOUT[..], args].concat())
}

fn json(rt: &Runtime, args: &[&str]) -> Value {
    let out = ok(rt, args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("berth cri {args:?} printed no JSON ({e}):\n{out}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Polls `f` until it returns `Some`, for at most `limit`.
fn eventually<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn pod_json(logs: &std::path::Path) -> String {
    serde_json::json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "uid-web-1", "attempt": 0},
        "hostname": "web",
        "log_directory": logs,
        "labels": {"app": "web"},
        // No CNI in this test: the pod shares the host's network, named as crictl users do.
        "linux": {"security_context": {"namespace_options": {"network": "NODE"}}},
    })
    .to_string()
}

fn container_yaml(image: &str) -> String {
    format!(
        "metadata:\n  name: app\nimage:\n  image: {image}\n\
         command: [sh, -c, 'echo hello; echo oops >&2; exec sleep 3600']\n\
         logPath: app.log\nlabels:\n  io.kubernetes.pod.name: web\n"
    )
}

#[tokio::test]
async fn pod_and_container_lifecycle_runs_end_to_end_with_runc() {
    let registry = Registry::start();
    let pushed = registry.push_image("busybox", "1.0", &busybox_image(Format::Oci)).await;
    let image = pushed.reference.clone();
    common_cri::ensure_monitor();
    let rt = Runtime::start(&[registry.host()]);
    ok(&rt, &["pull", &image]);

    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let pod_file = dir.path().join("pod.json");
    let ctr_file = dir.path().join("container.yaml");
    std::fs::write(&pod_file, pod_json(&logs)).unwrap();
    std::fs::write(&ctr_file, container_yaml(&image)).unwrap();
    let (pod_path, ctr_path) = (pod_file.to_str().unwrap(), ctr_file.to_str().unwrap());

    // runp, create and start print the ids.
    let pod = ok(&rt, &["runp", pod_path]).trim().to_string();
    assert!(!pod.is_empty() && !pod.contains(char::is_whitespace), "pod id {pod:?}");
    let ctr = ok(&rt, &["create", &pod, ctr_path, pod_path]).trim().to_string();
    assert!(!ctr.is_empty() && !ctr.contains(char::is_whitespace), "container id {ctr:?}");
    assert_eq!(ok(&rt, &["start", &ctr]).trim(), ctr);
    let short = |id: &str| id.chars().take(13).collect::<String>();

    // ps: crictl's table, ids, JSON.
    let table = ok(&rt, &["ps"]);
    let header: Vec<_> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["CONTAINER", "IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT", "POD", "ID", "POD"]);
    let row = rows(&table).into_iter().find(|r| r[0] == short(&ctr)).unwrap_or_else(|| panic!("{ctr} in\n{table}"));
    assert!(row.contains(&"Running".to_string()) && row.contains(&"app".to_string()), "{table}");
    assert_eq!(row.last().map(String::as_str), Some("web"), "{table}");
    assert!(row.contains(&short(&pod)), "{table}");
    assert_eq!(ok(&rt, &["ps", "-q"]).trim(), ctr);
    let listed = json(&rt, &["ps", "-o", "json"]);
    assert_eq!(listed["containers"][0]["state"], "CONTAINER_RUNNING", "{listed}");
    assert_eq!(listed["containers"][0]["podSandboxId"], pod.as_str(), "{listed}");

    // pods: crictl's table with the handler.
    let table = ok(&rt, &["pods"]);
    let row = rows(&table).into_iter().find(|r| r[0] == short(&pod)).unwrap_or_else(|| panic!("{pod} in\n{table}"));
    for cell in ["Ready", "web", "default"] {
        assert!(row.contains(&cell.to_string()), "{cell} in {table}");
    }
    assert_eq!(ok(&rt, &["pods", "-q", "--name", "^we"]).trim(), pod);
    assert_eq!(ok(&rt, &["pods", "-q", "--namespace", "^kube"]).trim(), "");

    // inspect and inspectp, by id prefix.
    let status = json(&rt, &["inspect", &ctr[..12]]);
    assert_eq!(status["status"]["id"], ctr.as_str(), "{status}");
    assert_eq!(status["status"]["state"], "CONTAINER_RUNNING", "{status}");
    assert!(status["status"]["logPath"].as_str().unwrap_or_default().ends_with("app.log"), "{status}");
    let status = json(&rt, &["inspectp", &pod]);
    assert_eq!(status["status"]["state"], "SANDBOX_READY", "{status}");
    assert_eq!(status["status"]["metadata"]["name"], "web", "{status}");

    // logs: stdout to stdout, stderr to stderr.
    let out = eventually(Duration::from_secs(15), "the container's log", || {
        let out = cri(&rt, &["logs", &ctr]);
        (out.status.success() && text(&out.stdout) == "hello\n").then_some(out)
    });
    assert_eq!(text(&out.stderr), "oops\n");
    let last = cri(&rt, &["logs", "--tail", "1", &ctr]);
    assert_eq!(text(&last.stdout).lines().count() + text(&last.stderr).lines().count(), 1);
    let stamped = ok(&rt, &["logs", "--timestamps", &ctr]);
    assert!(stamped.ends_with(" hello\n") && stamped.starts_with("20"), "{stamped:?}");

    // exec -s: the command's streams and exit code become ours.
    let out = cri(&rt, &["exec", "-s", &ctr, "sh", "-c", "echo out; echo err >&2; exit 3"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "out\n");
    assert_eq!(text(&out.stderr), "err\n");
    assert_eq!(ok(&rt, &["exec", &ctr, "echo", "-n", "hi"]), "hi");

    // stop by prefix, then the container shows as exited and `logs -f` ends by itself.
    assert_eq!(ok(&rt, &["stop", "-t", "2", &ctr[..12]]).trim(), &ctr[..12]);
    let table = ok(&rt, &["ps", "-a"]);
    let row = rows(&table).into_iter().find(|r| r[0] == short(&ctr)).unwrap_or_else(|| panic!("{ctr} in\n{table}"));
    assert!(row.contains(&"Exited".to_string()), "{table}");
    assert_eq!(ok(&rt, &["ps", "-q"]).trim(), "", "no running containers");
    let mut follow = rt.cri_spawn(&[&TIMEOUT[..], &["logs", "-f", &ctr]].concat());
    let done = eventually(Duration::from_secs(10), "logs -f to end", || follow.try_wait().unwrap());
    assert!(done.success());

    // rm, stopp, rmp.
    assert_eq!(ok(&rt, &["rm", &ctr]).trim(), ctr);
    assert_eq!(ok(&rt, &["ps", "-a", "-q"]).trim(), "");
    assert_eq!(ok(&rt, &["stopp", &pod]).trim(), format!("Stopped sandbox {pod}"));
    let table = ok(&rt, &["pods"]);
    assert!(rows(&table).iter().any(|r| r[0] == short(&pod) && r.contains(&"NotReady".to_string())), "{table}");
    assert_eq!(ok(&rt, &["rmp", &pod]).trim(), format!("Removed sandbox {pod}"));
    assert_eq!(ok(&rt, &["pods", "-q"]).trim(), "");
}

#[test]
fn unknown_ids_fail_with_crictls_messages() {
    let rt = Runtime::start(&[]);
    let out = cri(&rt, &["inspect", "nonexistent"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(r#"getting the status of the container "nonexistent": rpc error: code = "#),
        "{}",
        text(&out.stderr)
    );
    let out = cri(&rt, &["inspectp", "nonexistent"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains(r#"getting the pod sandbox status for "nonexistent": rpc error: code = "#), "{err}");
    let out = cri(&rt, &["start", "nonexistent"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains(r#"starting the container "nonexistent": rpc error"#), "{}", text(&out.stderr));
}

#[test]
fn a_pod_config_without_uid_is_refused_before_any_call() {
    let rt = Runtime::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let pod = dir.path().join("pod.yaml");
    std::fs::write(&pod, "metadata:\n  name: web\n  namespace: default\n").unwrap();
    let out = cri(&rt, &["runp", pod.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("load podSandboxConfig: name, namespace or uid is not in metadata"), "{err}");
    let out = cri(&rt, &["runp", "/nonexistent/pod.json"]);
    assert!(text(&out.stderr).contains("config at /nonexistent/pod.json not found"), "{}", text(&out.stderr));
}
