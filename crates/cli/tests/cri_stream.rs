//! End to end: the streaming verbs of `berth cri` — `exec` (streamed, with `-i` and `-t`),
//! `attach` and `port-forward` — against the real `berth runtime` with runc and a busybox image
//! from a loopback registry, as a user runs them from a shell.

mod common_cri;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use berth_testenv::Registry;
use berth_testenv::images::{Format, busybox_image};
use common_cri::{RemovePodsOnPanic, Runtime};

/// Sandboxes and containers take longer than crictl's 2 s default in a debug build.
const TIMEOUT: [&str; 2] = ["-t", "60s"];

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(rt: &Runtime, args: &[&str]) -> String {
    rt.ok(&[&TIMEOUT[..], args].concat())
}

/// `berth cri ARGS` against `rt`, not yet started.
fn cri_command(rt: &Runtime, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_berth"));
    cmd.arg("cri")
        .args(TIMEOUT)
        .args(args)
        .env("CONTAINER_RUNTIME_ENDPOINT", format!("unix://{}", rt.socket().display()))
        .env_remove("IMAGE_SERVICE_ENDPOINT");
    cmd
}

/// Runs `cmd` with `input` on its stdin; its output, within `limit`.
fn run_with_input(mut cmd: Command, input: &[u8], limit: Duration) -> Output {
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    wait_output(child, limit)
}

/// Waits for `child` at most `limit` (then kills it and fails).
fn wait_output(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!("still running after {limit:?}; stdout {:?}, stderr {:?}", text(&out.stdout), text(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// `script` giving a command a terminal of its own: we type on its stdin and read its screen.
struct Terminal {
    child: Child,
    keys: Option<std::process::ChildStdin>,
    screen: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    reader: std::thread::JoinHandle<()>,
}

impl Terminal {
    fn start(mut cmd: Command) -> Terminal {
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
        let keys = child.stdin.take();
        let mut stdout = child.stdout.take().unwrap();
        let screen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let shared = screen.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    return;
                }
                shared.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Terminal { child, keys, screen, reader }
    }

    fn screen(&self) -> String {
        text(&self.screen.lock().unwrap())
    }

    /// Waits until the screen shows `what` (new since the last expectation or not).
    fn expect(&self, what: &str, description: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.screen().contains(what) {
            assert!(Instant::now() < deadline, "no {description} on the terminal: {:?}", self.screen());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn type_keys(&mut self, keys: &[u8]) {
        let input = self.keys.as_mut().unwrap();
        input.write_all(keys).unwrap();
        input.flush().unwrap();
    }

    /// Waits for the command to end (our end of the terminal open until then): its status and screen.
    fn wait(mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                self.child.kill().unwrap();
                panic!("still running after {limit:?}: {:?}", self.screen());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        drop(self.keys.take());
        let screen = self.screen.clone();
        self.reader.join().unwrap();
        (status, text(&screen.lock().unwrap()))
    }
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

/// A registry with busybox pushed and a runtime that pulled it: (registry, runtime, image).
async fn runtime_with_busybox(start: impl FnOnce(&str) -> Runtime) -> (Registry, Runtime, String) {
    let registry = Registry::start();
    let pushed = registry.push_image("busybox", "1.0", &busybox_image(Format::Oci)).await;
    common_cri::ensure_monitor();
    let rt = start(registry.host());
    ok(&rt, &["pull", &pushed.reference]);
    (registry, rt, pushed.reference.clone())
}

/// Writes the pod config (on the host's network unless `own_network`) and runs the pod: (pod id, config path).
fn run_pod(rt: &Runtime, dir: &Path, name: &str, own_network: bool) -> (String, String) {
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let mut pod = serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "attempt": 0},
        "hostname": name,
        "log_directory": logs,
    });
    if !own_network {
        pod["linux"] = serde_json::json!({"security_context": {"namespace_options": {"network": "NODE"}}});
    }
    let path = dir.join(format!("{name}-pod.json"));
    std::fs::write(&path, pod.to_string()).unwrap();
    let path = path.to_str().unwrap().to_string();
    let id = ok(rt, &["runp", &path]).trim().to_string();
    (id, path)
}

/// Creates and starts a container from `config` (merged over name, image and log path).
fn run_container(
    rt: &Runtime,
    dir: &Path,
    pod: &str,
    pod_config: &str,
    image: &str,
    config: serde_json::Value,
) -> String {
    let mut container = serde_json::json!({
        "metadata": {"name": "app"},
        "image": {"image": image},
        "log_path": "app.log",
    });
    for (k, v) in config.as_object().unwrap() {
        container[k] = v.clone();
    }
    let name = container["metadata"]["name"].as_str().unwrap().to_string();
    let path = dir.join(format!("{name}-container.json"));
    std::fs::write(&path, container.to_string()).unwrap();
    let id = ok(rt, &["create", pod, path.to_str().unwrap(), pod_config]).trim().to_string();
    ok(rt, &["start", &id]);
    id
}

fn remove_pod(rt: &Runtime, pod: &str) {
    ok(rt, &["stopp", pod]);
    ok(rt, &["rmp", pod]);
    assert_eq!(ok(rt, &["pods", "-q"]).trim(), "");
}

#[tokio::test]
async fn exec_streams_stdin_stdout_and_stderr_and_exits_with_the_commands_code() {
    let (_registry, rt, image) = runtime_with_busybox(|host| Runtime::start(&[host])).await;
    let _cleanup = RemovePodsOnPanic::new(&rt);
    let dir = tempfile::tempdir().unwrap();
    let (pod, pod_config) = run_pod(&rt, dir.path(), "exec", false);
    let ctr =
        run_container(&rt, dir.path(), &pod, &pod_config, &image, serde_json::json!({"command": ["sleep", "3600"]}));

    // -i: our stdin is the command's; its exit code is ours.
    let cmd = cri_command(&rt, &["exec", "-i", &ctr, "sh", "-c", "read x; echo got $x; exit 3"]);
    let out = run_with_input(cmd, b"hello\n", Duration::from_secs(60));
    assert_eq!(text(&out.stdout), "got hello\n", "stderr: {}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(3), "stderr: {}", text(&out.stderr));

    // All of stdin arrives and its end reaches the command.
    let input: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
    let cmd = cri_command(&rt, &["exec", "-i", &ctr, "wc", "-l"]);
    let out = run_with_input(cmd, input.as_bytes(), Duration::from_secs(60));
    assert_eq!(text(&out.stdout).trim(), "20000", "stderr: {}", text(&out.stderr));
    assert!(out.status.success());

    // Without -i: streamed, stdout and stderr apart, our stdin left alone.
    let cmd = cri_command(&rt, &["exec", &ctr, "sh", "-c", "echo out; echo err >&2; exit 4"]);
    let out = run_with_input(cmd, b"not for the command\n", Duration::from_secs(60));
    assert_eq!((text(&out.stdout).as_str(), text(&out.stderr).as_str()), ("out\n", "err\n"));
    assert_eq!(out.status.code(), Some(4));

    // -t as crictl takes it: only with -i, and only with a terminal on stdin.
    let out = run_with_input(cri_command(&rt, &["exec", "-t", &ctr, "true"]), b"", Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("execing command in container: tty=true must be specified with interactive=true"),
        "{}",
        text(&out.stderr)
    );
    let out = run_with_input(cri_command(&rt, &["exec", "-it", &ctr, "true"]), b"", Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("execing command in container: input is not a terminal"),
        "{}",
        text(&out.stderr)
    );

    // A failure of the exec itself is an error, not an exit code.
    let out = run_with_input(cri_command(&rt, &["exec", &ctr, "/no/such/binary"]), b"", Duration::from_secs(60));
    assert!(!out.status.success());
    assert!(!text(&out.stderr).is_empty());

    remove_pod(&rt, &pod);
}

#[tokio::test]
async fn exec_with_a_terminal_runs_interactively_and_follows_the_terminals_size() {
    let (_registry, rt, image) = runtime_with_busybox(|host| Runtime::start(&[host])).await;
    let _cleanup = RemovePodsOnPanic::new(&rt);
    let dir = tempfile::tempdir().unwrap();
    let (pod, pod_config) = run_pod(&rt, dir.path(), "tty", false);
    let ctr =
        run_container(&rt, dir.path(), &pod, &pod_config, &image, serde_json::json!({"command": ["sleep", "3600"]}));
    let berth = env!("CARGO_BIN_EXE_berth");
    let endpoint = format!("unix://{}", rt.socket().display());
    let script = |shell: &str| {
        let mut cmd = Command::new("script");
        // `script` runs $SHELL: pin it, so the test does not depend on the caller's login shell.
        cmd.args(["-qec", shell, "/dev/null"]).env("SHELL", "/bin/sh").env("CONTAINER_RUNTIME_ENDPOINT", &endpoint);
        cmd
    };

    // A shell on a terminal, typed into once it prompts: what we type runs there on a tty of
    // its own with our size, ctrl-c reaches the remote command (our terminal is raw), the
    // shell's exit code is ours, and our terminal is back to cooked mode afterwards.
    let shell = format!(
        "stty cols 80 rows 24; {berth} cri -t 60s exec -it {ctr} sh; code=$?; \
         stty -a | tr ' ;' '\\n\\n' | grep -x -e -icanon -e icanon -e -echo -e echo | sed 's/^/local: /'; exit $code"
    );
    let mut terminal = Terminal::start(script(&shell));
    terminal.expect("/ # ", "the prompt");
    terminal.type_keys(b"tty; echo answer-$((6 * 7)); stty size\r");
    terminal.expect("answer-42", "the answer");
    terminal.type_keys(b"sleep 30\r");
    std::thread::sleep(Duration::from_millis(500));
    terminal.type_keys(b"\x03");
    terminal.type_keys(b"echo after-$((1 + 1))\r");
    terminal.expect("after-2", "the shell to go on after ctrl-c");
    terminal.type_keys(b"exit 7\r");
    let (status, screen) = terminal.wait(Duration::from_secs(30));
    // runc stops the container's terminal from turning "\n" into "\r\n" only once the command
    // runs, so its first lines may pass through two terminals that both did: "\r\r\n", which
    // shows the same.
    let screen = screen.replace("\r\r\n", "\r\n");
    assert!(screen.contains("/dev/pts/"), "the remote command has a terminal: {screen}");
    assert!(screen.contains("\r\n24 80\r\n"), "the remote terminal has our size: {screen:?}");
    let local: Vec<&str> = screen.lines().filter_map(|l| l.trim().strip_prefix("local: ")).collect();
    assert_eq!(local, ["icanon", "echo"], "our terminal is restored: {screen}");
    assert_eq!(status.code(), Some(7), "{screen}");

    // Resizing our terminal resizes the remote one. The terminal reaches the background job
    // through fd 3: POSIX shells give an asynchronous list /dev/null as stdin before its own
    // redirections, so `<&0` would be /dev/null under dash.
    // The initial size is set before the command starts: asking at once finds it, and TERM.
    let remote = "echo size=$(stty size) term=$TERM; i=0; \
                  while [ \"$(stty size)\" = \"24 80\" ] && [ $i -lt 150 ]; do sleep 0.1; i=$((i+1)); done; \
                  echo size=$(stty size); exit 5";
    let shell = format!(
        "stty cols 80 rows 24; exec 3<&0; {berth} cri -t 60s exec -it {ctr} sh -c '{remote}' <&3 & \
         sleep 2; stty cols 132 rows 43; wait $!"
    );
    let mut child = script(&shell).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // Our end of the terminal stays open until the session is over.
    let keep_open = child.stdin.take();
    let out = wait_output(child, Duration::from_secs(60));
    drop(keep_open);
    let screen = text(&out.stdout);
    let sizes: Vec<&str> = screen.lines().filter_map(|l| l.trim().strip_prefix("size=")).collect();
    assert_eq!(sizes, ["24 80 term=xterm", "43 132"], "{screen}");
    assert_eq!(out.status.code(), Some(5), "{screen}");

    remove_pod(&rt, &pod);
}

#[tokio::test]
async fn attach_passes_input_to_the_container_and_shows_its_output_until_it_exits() {
    let (_registry, rt, image) = runtime_with_busybox(|host| Runtime::start(&[host])).await;
    let _cleanup = RemovePodsOnPanic::new(&rt);
    let dir = tempfile::tempdir().unwrap();
    let (pod, pod_config) = run_pod(&rt, dir.path(), "attach", false);
    // With stdin_once, the end of the first attached input closes the container's stdin.
    let ctr = run_container(
        &rt,
        dir.path(),
        &pod,
        &pod_config,
        &image,
        serde_json::json!({
            "command": ["sh", "-c", "while read line; do echo \"echo: $line\"; echo \"err: $line\" >&2; done; echo bye"],
            "stdin": true,
            "stdin_once": true,
        }),
    );

    // -t needs -i, as for exec; nothing reaches the container then.
    let out = run_with_input(cri_command(&rt, &["attach", "-t", &ctr]), b"", Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("attaching running container failed: tty=true must be specified with interactive=true"),
        "{err}"
    );

    let out = run_with_input(cri_command(&rt, &["attach", "-i", &ctr]), b"one\ntwo\n", Duration::from_secs(60));
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "echo: one\necho: two\nbye\n", "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "err: one\nerr: two\n");
    let state = eventually(Duration::from_secs(15), "the container to exit", || {
        let status: serde_json::Value = serde_json::from_str(&ok(&rt, &["inspect", &ctr])).unwrap();
        (status["status"]["state"] == "CONTAINER_EXITED").then_some(status)
    });
    assert_eq!(state["status"]["exitCode"], 0, "{state}");

    remove_pod(&rt, &pod);
}

/// Connects to the forwarded `port`, sends `message`, half-closes, and reads the echo.
fn echo_through(port: u16, message: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut conn = TcpStream::connect(("127.0.0.1", port))?;
    conn.set_read_timeout(Some(Duration::from_secs(20)))?;
    conn.write_all(message)?;
    conn.shutdown(std::net::Shutdown::Write)?;
    let mut echoed = Vec::new();
    conn.read_to_end(&mut echoed)?;
    Ok(echoed)
}

/// Reads `child`'s stdout up to the first line holding `what`.
fn line_with(stdout: &mut impl std::io::BufRead, what: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "stdout ended before a line with {what:?}");
        if line.contains(what) {
            return line;
        }
    }
}

/// SIGTERM, as a user's ctrl-c or a supervisor ends it; a clean exit.
fn terminate(mut child: Child) -> Output {
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let _ = child.stdin.take();
    wait_output(child, Duration::from_secs(20))
}

#[tokio::test]
async fn port_forward_carries_tcp_connections_to_a_port_in_the_pods_network() {
    let (_registry, mut rt, image) =
        runtime_with_busybox(|host| Runtime::start_with_pods(host, "berthsx0", "10.209.0.0/24")).await;
    let _cleanup = RemovePodsOnPanic::new(&rt);
    let dir = tempfile::tempdir().unwrap();
    let (pod, pod_config) = run_pod(&rt, dir.path(), "forward", true);
    // An echo server on the pod's own network (each connection gets a `cat`).
    run_container(
        &rt,
        dir.path(),
        &pod,
        &pod_config,
        &image,
        serde_json::json!({"command": ["nc", "-ll", "-p", "5000", "-e", "cat"]}),
    );

    // Any free local port (0): the one picked is printed, on IPv4 and IPv6 loopback.
    let mut forward = cri_command(&rt, &["port-forward", &pod, "0:5000"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(forward.stdout.take().unwrap());
    let line = line_with(&mut stdout, "Forwarding from 127.0.0.1:");
    let local: u16 = line
        .trim()
        .strip_prefix("Forwarding from 127.0.0.1:")
        .and_then(|rest| rest.strip_suffix(" -> 5000"))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected line {line:?}"));
    // The echo server may still be starting: its first connections may fail.
    eventually(Duration::from_secs(30), "an echo through the forwarded port", || {
        (echo_through(local, b"ping\n").ok()? == b"ping\n").then_some(())
    });
    // More connections over the same forward, one of them large.
    let big: Vec<u8> = (0..1_000_000u32).map(|n| (n % 253) as u8).collect();
    assert!(echo_through(local, &big).unwrap() == big, "a large echo differs");
    assert_eq!(echo_through(local, b"again\n").unwrap(), b"again\n");
    line_with(&mut stdout, &format!("Handling connection for {local}"));
    let out = terminate(forward);
    assert!(out.status.success(), "port-forward ended with {}: {}", out.status, text(&out.stderr));

    // A given local port, and a remote port nothing listens on: that connection fails with
    // the runtime's reason, the forward goes on.
    let (unserved, served) = {
        let (a, b) =
            (std::net::TcpListener::bind("127.0.0.1:0").unwrap(), std::net::TcpListener::bind("127.0.0.1:0").unwrap());
        (a.local_addr().unwrap().port(), b.local_addr().unwrap().port())
    };
    let (spec_unserved, spec_served) = (format!("{unserved}:5001"), format!("{served}:5000"));
    let mut forward = cri_command(&rt, &["port-forward", &pod, &spec_unserved, &spec_served])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(forward.stdout.take().unwrap());
    line_with(&mut stdout, &format!("Forwarding from 127.0.0.1:{unserved} -> 5001"));
    line_with(&mut stdout, &format!("Forwarding from 127.0.0.1:{served} -> 5000"));
    assert_eq!(echo_through(unserved, b"nobody\n").unwrap_or_default(), b"");
    assert_eq!(echo_through(served, b"still\n").unwrap(), b"still\n");
    let out = terminate(forward);
    assert!(out.status.success(), "port-forward ended with {}", out.status);
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "an error occurred forwarding {unserved} -> 5001: error forwarding port 5001 to pod {pod}"
        )),
        "{err}"
    );

    // The runtime going away ends the forward with an error, as kubectl's does.
    let mut forward = cri_command(&rt, &["port-forward", &pod, "0:5000"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(forward.stdout.take().unwrap());
    line_with(&mut stdout, "Forwarding from 127.0.0.1:");
    rt.kill9();
    let out = wait_output(forward, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("port forward: lost connection to pod"), "{}", text(&out.stderr));
    rt.restart();

    remove_pod(&rt, &pod);
}
