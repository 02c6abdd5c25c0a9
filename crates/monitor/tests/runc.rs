//! Integration tests of the monitor with the real `runc` (root required) and busybox bundles.

use std::fs;
use std::io::Write;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use berth_monitor::attach::{Frame, read_frame};
use berth_monitor::{
    ContainerExit, LaunchOptions, MonitorError, MonitorHandle, is_alive, launch, read_exit, reopen_log,
};
use serde_json::json;

const MONITOR: &str = env!("CARGO_BIN_EXE_berth-monitor");
const HELPER_ENV: &str = "BERTH_MONITOR_TEST_HELPER_DIR";

/// A busybox bundle, a runc root and a monitor state dir in one temporary directory; dropping it
/// deletes the container, kills a monitor that is still running and removes the directory.
struct Fixture {
    dir: PathBuf,
    id: String,
    _tmp: Option<tempfile::TempDir>,
}

impl Fixture {
    fn new(name: &str, args: &[&str]) -> Self {
        Self::with_resources(name, args, json!({}))
    }

    fn with_resources(name: &str, args: &[&str], resources: serde_json::Value) -> Self {
        assert!(nix::unistd::geteuid().is_root(), "the runc tests need root");
        let tmp = tempfile::Builder::new().prefix("berth-monitor-").tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        fs::create_dir_all(dir.join("logs")).unwrap();
        berth_testenv::bundle::write_busybox_bundle(&dir.join("bundle"), args, "monitor-test", resources);
        // runc names the container's cgroups after its id: unique per process and test.
        let id = format!("berth-monitor-{}-{name}", std::process::id());
        Fixture { dir, id, _tmp: Some(tmp) }
    }

    /// The fixture a helper process was handed (it does not own the directory).
    fn attach(dir: PathBuf) -> Self {
        let id = fs::read_to_string(dir.join("id")).unwrap();
        Fixture { dir, id, _tmp: None }
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("logs/0.log")
    }

    fn options(&self) -> LaunchOptions {
        let pid_file = self.state_dir().join("container.pid");
        let runc_root = self.dir.join("runc");
        LaunchOptions {
            monitor_binary: MONITOR.into(),
            id: self.id.clone(),
            state_dir: self.state_dir(),
            log_path: Some(self.log_path()),
            pid_file: pid_file.clone(),
            create_command: vec![
                "runc".into(),
                "--root".into(),
                runc_root.into(),
                "create".into(),
                "--bundle".into(),
                self.dir.join("bundle").into(),
                "--pid-file".into(),
                pid_file.into(),
                self.id.clone().into(),
            ],
            stdin: false,
            stdin_once: false,
            attach_socket: None,
            console_socket: None,
        }
    }

    fn runc(&self, args: &[&str]) -> Output {
        Command::new("runc").arg("--root").arg(self.dir.join("runc")).args(args).output().unwrap()
    }

    fn runc_ok(&self, args: &[&str]) {
        let out = self.runc(args);
        assert!(out.status.success(), "runc {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn start(&self) {
        self.runc_ok(&["start", &self.id]);
    }

    fn runc_status(&self) -> String {
        let out = self.runc(&["state", &self.id]);
        let state: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        state["status"].as_str().unwrap_or("absent").to_string()
    }

    fn wait_exit(&self) -> ContainerExit {
        wait_for(Duration::from_secs(10), || read_exit(&self.state_dir()).unwrap())
            .expect("exit.json appears within 10 s")
    }

    fn log(&self) -> Vec<LogLine> {
        read_log(&self.log_path())
    }

    /// In a subdirectory that does not exist yet: the monitor creates it.
    fn attach_path(&self) -> PathBuf {
        self.dir.join("attach/c.sock")
    }

    /// Options with a stdin pipe and the attach socket.
    fn attach_options(&self) -> LaunchOptions {
        LaunchOptions { stdin: true, attach_socket: Some(self.attach_path()), ..self.options() }
    }

    fn connect(&self) -> UnixStream {
        let stream = UnixStream::connect(self.attach_path()).expect("the attach socket accepts clients");
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        stream
    }
}

/// What an attach client has received so far.
#[derive(Debug, Default)]
struct Received {
    stdout: Vec<Vec<u8>>,
    stderr: Vec<u8>,
    exit: Option<i32>,
    /// The connection ended (after the exit frame, or without one if the client was dropped).
    closed: bool,
}

impl Received {
    fn stdout_bytes(&self) -> Vec<u8> {
        self.stdout.concat()
    }

    /// Reads frames until `done` holds (or the connection ends); panics on a protocol error or
    /// after the 10 s read timeout.
    fn read_until(&mut self, client: &mut UnixStream, done: impl Fn(&Received) -> bool) {
        while !done(self) && !self.closed {
            match read_frame(client).expect("a well-formed frame within 10 s") {
                Some(Frame::Stdout(data)) => self.stdout.push(data),
                Some(Frame::Stderr(data)) => self.stderr.extend_from_slice(&data),
                Some(Frame::Exit(code)) => {
                    assert_eq!(self.exit, None, "one exit frame");
                    self.exit = Some(code);
                }
                None => self.closed = true,
            }
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if self._tmp.is_none() {
            return; // a helper's view; the test that owns the directory cleans up
        }
        let _ = self.runc(&["delete", "-f", &self.id]);
        if let Ok(Some(pid)) = berth_monitor::read_monitor_pid(&self.state_dir())
            && is_alive(pid)
        {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
struct LogLine {
    time: jiff::Timestamp,
    stream: String,
    tag: String,
    content: String,
}

fn read_log(path: &Path) -> Vec<LogLine> {
    let mut text = fs::read_to_string(path).unwrap_or_default();
    // The monitor may be mid-write: only whole lines count.
    text.truncate(text.rfind('\n').map_or(0, |i| i + 1));
    text.lines()
        .map(|line| {
            let mut parts = line.splitn(4, ' ');
            let mut next = || parts.next().unwrap_or_else(|| panic!("malformed log line {line:?}")).to_string();
            let time = next().parse().unwrap_or_else(|e| panic!("bad timestamp in {line:?}: {e}"));
            LogLine { time, stream: next(), tag: next(), content: next() }
        })
        .collect()
}

/// Lines that came from the container (runc's own warnings go to the same stderr).
fn container_lines(log: &[LogLine]) -> Vec<(String, String, String)> {
    log.iter()
        .filter(|l| !l.content.starts_with("time=\""))
        .map(|l| (l.stream.clone(), l.tag.clone(), l.content.clone()))
        .collect()
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

fn assert_monitor_exits(handle: &MonitorHandle) {
    assert!(
        wait_for(Duration::from_secs(5), || (!is_alive(handle.monitor_pid)).then_some(())).is_some(),
        "monitor {} still runs after the container exited",
        handle.monitor_pid
    );
}

fn monitors_of(state_dir: &Path) -> Vec<i32> {
    let needle = state_dir.to_string_lossy().into_owned();
    fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| is_alive(pid))
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
        })
        .collect()
}

fn status_kib(pid: i32, field: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_container_that_exits_leaves_its_exit_code_and_both_streams_in_the_log() {
    let fx = Fixture::new("exit3", &["sh", "-c", "echo out; echo err >&2; exit 3"]);
    let handle = launch(&fx.options()).unwrap();
    assert!(is_alive(handle.monitor_pid));
    assert_eq!(fx.runc_status(), "created");
    fx.start();
    let exit = fx.wait_exit();
    assert_eq!((exit.exit_code, exit.signal, exit.oom_killed), (3, None, false));
    let finished: jiff::Timestamp = exit.finished_at.parse().unwrap();

    let log = fx.log();
    let lines = container_lines(&log);
    assert!(lines.contains(&("stdout".into(), "F".into(), "out".into())), "{log:#?}");
    assert!(lines.contains(&("stderr".into(), "F".into(), "err".into())), "{log:#?}");
    let now = jiff::Timestamp::now();
    for line in &log {
        assert!(
            line.time <= finished && now.duration_since(line.time) < jiff::SignedDuration::from_secs(60),
            "{line:?}"
        );
    }
    assert_monitor_exits(&handle);
    assert!(!fx.state_dir().join("monitor.pid").exists());
}

#[test]
fn a_long_unterminated_line_is_logged_as_partial_pieces_that_reassemble() {
    let script = "head -c 102400 /dev/zero | tr '\\0' x; exit 0";
    let fx = Fixture::new("longline", &["sh", "-c", script]);
    launch(&fx.options()).unwrap();
    fx.start();
    assert_eq!(fx.wait_exit().exit_code, 0);

    let pieces: Vec<_> = fx.log().into_iter().filter(|l| l.stream == "stdout").collect();
    let tags: String = pieces.iter().map(|l| l.tag.as_str()).collect();
    assert_eq!(tags, "PPPPPPF", "16 KiB pieces, the rest full");
    assert!(pieces.iter().all(|l| l.content.len() <= 16 * 1024));
    let whole: String = pieces.iter().map(|l| l.content.as_str()).collect();
    assert_eq!(whole, "x".repeat(102_400));
}

/// Not a test on its own: the helper process of the survival test. It launches a monitor for the
/// fixture named in its environment, writes the handle next to it and waits to be killed.
#[test]
fn helper_process_launches_a_monitor_and_waits_to_be_killed() {
    let Some(dir) = std::env::var_os(HELPER_ENV) else { return };
    let fx = Fixture::attach(dir.into());
    let handle = launch(&fx.options()).unwrap();
    fs::write(fx.dir.join("handle.tmp"), format!("{} {}", handle.monitor_pid, handle.container_pid)).unwrap();
    fs::rename(fx.dir.join("handle.tmp"), fx.dir.join("handle")).unwrap();
    sleep(Duration::from_secs(60));
}

#[test]
fn the_monitor_and_its_container_outlive_a_launcher_killed_with_sigkill() {
    let fx = Fixture::new("survive", &["sleep", "1000"]);
    fs::write(fx.dir.join("id"), &fx.id).unwrap();
    let mut helper = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "helper_process_launches_a_monitor_and_waits_to_be_killed", "--test-threads=1"])
        .env(HELPER_ENV, &fx.dir)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let handle = wait_for(Duration::from_secs(10), || fs::read_to_string(fx.dir.join("handle")).ok());
    let pids: Vec<i32> = handle.expect("the helper launched").split(' ').map(|p| p.parse().unwrap()).collect();
    let handle = MonitorHandle { monitor_pid: pids[0], container_pid: pids[1] };
    helper.kill().unwrap(); // SIGKILL
    helper.wait().unwrap();

    sleep(Duration::from_millis(200));
    assert!(is_alive(handle.monitor_pid), "the monitor survived its launcher");
    assert_eq!(fx.runc_status(), "created");
    fx.start();
    assert_eq!(fx.runc_status(), "running");
    sleep(Duration::from_millis(200));
    assert!(is_alive(handle.monitor_pid));
    assert_eq!(read_exit(&fx.state_dir()).unwrap(), None);

    fx.runc_ok(&["kill", &fx.id, "KILL"]);
    let exit = fx.wait_exit();
    assert_eq!((exit.exit_code, exit.signal), (137, Some(9)));
    assert_monitor_exits(&handle);
}

#[test]
fn a_reopened_log_receives_new_lines_at_the_log_path_after_rotation() {
    let script = "echo before; while ! test -e /tmp/go; do sleep 0.05; done; echo after";
    let fx = Fixture::new("reopen", &["sh", "-c", script]);
    let handle = launch(&fx.options()).unwrap();
    fx.start();
    let has = |path: &Path, text: &str| read_log(path).iter().any(|l| l.content == text);
    assert!(wait_for(Duration::from_secs(5), || has(&fx.log_path(), "before").then_some(())).is_some());

    let rotated = fx.dir.join("logs/0.log.1");
    fs::rename(fx.log_path(), &rotated).unwrap();
    reopen_log(handle.monitor_pid).unwrap();
    assert!(wait_for(Duration::from_secs(5), || fx.log_path().exists().then_some(())).is_some(), "log reopened");
    fs::write(fx.dir.join("bundle/rootfs/tmp/go"), "").unwrap();
    assert_eq!(fx.wait_exit().exit_code, 0);

    assert!(has(&rotated, "before") && !has(&rotated, "after"), "{:#?}", read_log(&rotated));
    assert!(has(&fx.log_path(), "after") && !has(&fx.log_path(), "before"), "{:#?}", fx.log());
    assert_monitor_exits(&handle);
}

#[test]
fn a_failed_create_returns_the_runtimes_stderr_and_leaves_no_monitor() {
    let fx = Fixture::new("badbundle", &["true"]);
    fs::remove_file(fx.dir.join("bundle/config.json")).unwrap();
    let err = launch(&fx.options()).unwrap_err();
    let MonitorError::CreateFailed { exit_code, stderr } = &err else { panic!("not a create failure: {err}") };
    assert_eq!(*exit_code, Some(1));
    assert!(stderr.contains("config.json"), "runc's message: {stderr}");
    assert!(monitors_of(&fx.state_dir()).is_empty(), "no monitor is left running");
    assert!(!fx.state_dir().join("monitor.pid").exists());
    assert_eq!(fx.runc_status(), "absent");
}

#[test]
fn a_created_container_deleted_without_starting_is_recorded_as_killed() {
    let fx = Fixture::new("neverstarted", &["sleep", "1000"]);
    let handle = launch(&fx.options()).unwrap();
    fx.runc_ok(&["delete", "-f", &fx.id]);
    let exit = fx.wait_exit();
    assert_eq!((exit.exit_code, exit.signal), (137, Some(9)));
    assert_monitor_exits(&handle);
}

#[test]
fn an_idle_monitor_reports_its_resident_memory() {
    let fx = Fixture::new("rss", &["sh", "-c", "head -c 1048576 /dev/zero | tr '\\0' '\\n'; exec sleep 1000"]);
    let handle = launch(&fx.options()).unwrap();
    sleep(Duration::from_millis(300));
    let created = status_kib(handle.monitor_pid, "VmRSS:");
    fx.start();
    // 1 MiB of empty lines, then idle.
    assert!(wait_for(Duration::from_secs(10), || (fx.log().len() >= 1 << 20).then_some(())).is_some());
    sleep(Duration::from_millis(300));
    let pid = handle.monitor_pid;
    println!(
        "monitor idle RSS: VmRSS {created} KiB after create; after logging 1 MiB lines: VmRSS {} KiB \
         (RssAnon {} KiB, RssFile {} KiB)",
        status_kib(pid, "VmRSS:"),
        status_kib(pid, "RssAnon:"),
        status_kib(pid, "RssFile:")
    );
    fx.runc_ok(&["kill", &fx.id, "KILL"]);
    assert_eq!(fx.wait_exit().signal, Some(9));
    assert_monitor_exits(&handle);
}

#[test]
fn a_container_killed_by_the_oom_killer_is_recorded_as_oom_killed() {
    let limit = 32 * 1024 * 1024;
    let resources = json!({"memory": {"limit": limit, "swap": limit}});
    let script = "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived";
    let fx = Fixture::with_resources("oom", &["sh", "-c", script], resources);
    let handle = launch(&fx.options()).unwrap();
    fx.start();
    let exit = fx.wait_exit();
    assert_eq!((exit.signal, exit.oom_killed), (Some(9), true), "{exit:?}");
    assert_monitor_exits(&handle);
}

#[test]
fn attached_clients_see_the_output_of_what_they_write_to_stdin_then_the_exit_code() {
    let fx = Fixture::new("attach", &["sh"]);
    let handle = launch(&fx.attach_options()).unwrap();
    let (mut a, mut b) = (fx.connect(), fx.connect());
    let (mut got_a, mut got_b) = (Received::default(), Received::default());
    fx.start();

    a.write_all(b"echo hello\n").unwrap();
    for (client, got) in [(&mut a, &mut got_a), (&mut b, &mut got_b)] {
        got.read_until(client, |r| !r.stdout.is_empty());
        assert_eq!(got.stdout, [b"hello\n".to_vec()], "one stdout frame");
    }
    // The second client's input goes to the same stdin; its output to both.
    b.write_all(b"echo oops >&2\n").unwrap();
    for (client, got) in [(&mut a, &mut got_a), (&mut b, &mut got_b)] {
        got.read_until(client, |r| contains(&r.stderr, b"oops\n"));
    }
    a.write_all(b"exit 3\n").unwrap();
    for (client, got) in [(&mut a, &mut got_a), (&mut b, &mut got_b)] {
        got.read_until(client, |_| false);
        assert_eq!((got.exit, got.closed), (Some(3), true), "{got:?}");
        assert_eq!(got.stdout_bytes(), b"hello\n");
    }

    assert_eq!(read_exit(&fx.state_dir()).unwrap().map(|e| e.exit_code), Some(3), "exit.json precedes the frame");
    let lines = container_lines(&fx.log());
    assert!(lines.contains(&("stdout".into(), "F".into(), "hello".into())), "{lines:?}");
    assert!(lines.contains(&("stderr".into(), "F".into(), "oops".into())), "{lines:?}");
    assert_monitor_exits(&handle);
    assert!(!fx.attach_path().exists(), "the socket is removed");
}

#[test]
fn a_client_that_never_reads_does_not_stall_the_container_or_its_log() {
    let size = 4 << 20;
    let script = format!("head -c {size} /dev/zero | tr '\\0' x; echo; echo done");
    let fx = Fixture::new("stalled", &["sh", "-c", &script]);
    let handle = launch(&fx.attach_options()).unwrap();
    let mut stalled = fx.connect();
    fx.start();
    let exit = fx.wait_exit();
    assert_eq!(exit.exit_code, 0);
    let log = fx.log();
    let xs: usize = log.iter().filter(|l| l.stream == "stdout" && l.content != "done").map(|l| l.content.len()).sum();
    assert_eq!(xs, size, "all output is logged");
    assert!(container_lines(&log).contains(&("stdout".into(), "F".into(), "done".into())));

    // Dropped when it fell a megabyte behind: what it gets is a prefix, then EOF without an exit.
    let mut got = Received::default();
    got.read_until(&mut stalled, |_| false);
    let received = got.stdout_bytes();
    assert!(received.len() < size && received.iter().all(|&b| b == b'x'), "{} bytes", received.len());
    assert_eq!(got.exit, None);
    assert_monitor_exits(&handle);
}

#[test]
fn with_stdin_once_the_container_sees_eof_when_the_first_clients_input_ends() {
    let fx = Fixture::new("stdinonce", &["cat"]);
    let handle = launch(&LaunchOptions { stdin_once: true, ..fx.attach_options() }).unwrap();
    let mut client = fx.connect();
    fx.start();
    client.write_all(b"abc\n").unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    let mut got = Received::default();
    got.read_until(&mut client, |_| false);
    assert_eq!((got.stdout_bytes(), got.exit), (b"abc\n".to_vec(), Some(0)), "{got:?}");
    assert_monitor_exits(&handle);
}

#[test]
fn without_stdin_once_a_client_closing_its_input_leaves_stdin_open() {
    let fx = Fixture::new("stdinopen", &["cat"]);
    let handle = launch(&fx.attach_options()).unwrap();
    let mut first = fx.connect();
    fx.start();
    first.write_all(b"one\n").unwrap();
    first.shutdown(Shutdown::Write).unwrap();
    let mut got = Received::default();
    got.read_until(&mut first, |r| r.stdout_bytes() == b"one\n");
    drop(first);
    sleep(Duration::from_millis(200));
    assert_eq!(fx.runc_status(), "running", "cat still waits for input");

    let mut second = fx.connect();
    second.write_all(b"two\n").unwrap();
    let mut got = Received::default();
    got.read_until(&mut second, |r| r.stdout_bytes() == b"two\n");
    fx.runc_ok(&["kill", &fx.id, "KILL"]);
    got.read_until(&mut second, |_| false);
    assert_eq!(got.exit, Some(137));
    assert_monitor_exits(&handle);
}

#[test]
fn an_idle_monitor_with_stdin_and_attach_reports_its_resident_memory() {
    let fx = Fixture::new("attachrss", &["sh", "-c", "read line; echo \"got $line\"; exec sleep 1000"]);
    let handle = launch(&fx.attach_options()).unwrap();
    fx.start();
    sleep(Duration::from_millis(300));
    let pid = handle.monitor_pid;
    let without = status_kib(pid, "VmRSS:");

    let mut client = fx.connect();
    client.write_all(b"hi\n").unwrap();
    let mut got = Received::default();
    got.read_until(&mut client, |r| r.stdout_bytes() == b"got hi\n");
    sleep(Duration::from_millis(300));
    let with = status_kib(pid, "VmRSS:");
    println!(
        "attach monitor idle RSS: VmRSS {without} KiB without a client; VmRSS {with} KiB with one \
         attached (RssAnon {} KiB, RssFile {} KiB)",
        status_kib(pid, "RssAnon:"),
        status_kib(pid, "RssFile:")
    );
    assert!(without < 2048 && with < 2048, "idle RSS {without} / {with} KiB");
    fx.runc_ok(&["kill", &fx.id, "KILL"]);
    got.read_until(&mut client, |_| false);
    assert_eq!(got.exit, Some(137));
    assert_monitor_exits(&handle);
}

#[test]
fn a_container_with_a_terminal_writes_through_its_pty_reads_attach_input_and_is_resized() {
    let f = Fixture::new("tty", &["sh", "-c", "tty; read go; stty size; echo got $go"]);
    let config_path = f.dir.join("bundle/config.json");
    let mut config: serde_json::Value = serde_json::from_slice(&fs::read(&config_path).unwrap()).unwrap();
    config["process"]["terminal"] = json!(true);
    // A terminal needs a devpts of the container's own (runc links /dev/ptmx to it).
    let mounts = config["mounts"].as_array_mut().unwrap();
    mounts.retain(|m| !m["destination"].as_str().unwrap_or("").starts_with("/dev"));
    mounts.push(json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}));
    mounts.push(json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}));
    fs::write(&config_path, serde_json::to_vec(&config).unwrap()).unwrap();
    let console = f.dir.join("console.sock");
    let mut options = f.attach_options();
    options.console_socket = Some(console.clone());
    let id = options.create_command.pop().unwrap();
    options.create_command.extend(["--console-socket".into(), console.clone().into(), id]);
    let handle = launch(&options).unwrap();
    assert!(!console.exists(), "the console socket goes once the terminal arrived");
    let mut client = f.connect();
    f.start();

    let mut got = Received::default();
    got.read_until(&mut client, |r| contains(&r.stdout_bytes(), b"/dev/pts/"));
    berth_monitor::resize(&f.state_dir(), handle.monitor_pid, 100, 30).unwrap();
    // The monitor resizes on SIGWINCH; give it its loop turn before the container asks.
    sleep(Duration::from_millis(300));
    client.write_all(b"go\n").unwrap();
    got.read_until(&mut client, |r| r.exit.is_some());
    assert_eq!(got.exit, Some(0));
    let output = String::from_utf8_lossy(&got.stdout_bytes()).into_owned();
    // A terminal echoes the input and ends lines with CR LF.
    assert!(output.contains("go\r\n30 100\r\ngot go\r\n"), "{output:?}");
    assert!(got.stderr.is_empty(), "a terminal has no separate stderr");

    let log = f.log();
    let lines: Vec<&str> = log.iter().map(|l| l.content.as_str()).collect();
    assert!(lines[0].starts_with("/dev/pts/"), "{lines:?}");
    assert_eq!(&lines[1..], ["go", "30 100", "got go"]);
    let raw = fs::read_to_string(f.log_path()).unwrap();
    assert!(raw.contains(" stdout F 30 100\r\n"), "the terminal's CR stays in the log, as it was written: {raw:?}");
    assert!(log.iter().all(|l| l.stream == "stdout" && l.tag == "F"), "{log:?}");
    assert_eq!(f.wait_exit().exit_code, 0);
}
