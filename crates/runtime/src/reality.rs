//! [`HostReality`]: the real [`Reality`] that `Store::reconcile` asks after a restart, reading
//! the host instead of the records.
//!
//! # Where the monitor's files are
//!
//! Each container's monitor keeps its state dir (`monitor.pid`, `exit.json`, see
//! [`berth_monitor`]) at [`monitor_dir`]: `<state root>/containers/<id>/monitor/`, inside the
//! record's own directory ([`Store::container_dir`](crate::state::Store::container_dir)), so that
//! removing the record removes it too. CreateContainer must launch the monitor with exactly this
//! `state_dir`.
//!
//! # A container
//!
//! 1. `exit.json` present → [`Observed::Exited`] with its code, its `finished_at` converted to ns
//!    (0 if unparsable, which reconcile reads as "now") and its OOM flag (reconcile derives the
//!    reason: `OOMKilled`, `Completed` or `Error`). Present but unreadable → `Unknown`.
//! 2. A `Created` record whose monitor never started (StartContainer makes the OCI container) →
//!    `Created` while its rootfs is mounted, else (after a reboot) `Gone`.
//! 3. Otherwise the OCI runtime of the record's handler is asked for `state <id>`:
//!    `created`/`creating` → `Created{pid}`, `running`/`paused` → `Running{pid}`.
//!    - `stopped`, or not found: with a live monitor, the monitor is about to write `exit.json`
//!      (it is re-read for up to [`EXIT_GRACE`]), else `Unknown`; without one the exit was lost:
//!      `Gone`.
//!    - any other failure (runtime missing, timeout, bad output, unknown handler) → `Unknown`.
//!
//! # A sandbox
//!
//! `Alive` when its network namespace (if it has its own, `netns_path`) is still a mounted nsfs
//! file and its infra process (if it has one, `infra_pid`) is still a live process; `Gone` when
//! either is missing; `Unknown` when the check itself failed (a permission error, say).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use berth_oci::{OciError, OciRuntime, Status};

use crate::config::Config;
use crate::state::{ContainerRecord, ContainerState, Observed, ObservedSandbox, Reality, SandboxRecord};

/// The name of a container's monitor state dir inside its record's directory.
pub const MONITOR_DIR: &str = "monitor";

/// How long a live monitor of a stopped container is given to write `exit.json`.
pub const EXIT_GRACE: Duration = Duration::from_secs(2);

/// `<root>/containers/<id>/monitor`: the monitor's state dir of container `id` under the store
/// root `root` (the config's `root`).
pub fn monitor_dir(root: &Path, id: &str) -> PathBuf {
    root.join("containers").join(id).join(MONITOR_DIR)
}

/// The host as it is: monitor files under the store root, the handlers' OCI runtimes, namespaces
/// and processes in `/proc`. Every call blocks (it may run an OCI runtime): use it from
/// `spawn_blocking`, as reconcile is.
#[derive(Debug, Clone)]
pub struct HostReality {
    root: PathBuf,
    runtimes: BTreeMap<String, OciRuntime>,
}

impl HostReality {
    /// The reality of the runtime configured by `config`: its store root, and one OCI runtime per
    /// handler with the handler's binary, global args and `--root`.
    pub fn new(config: &Config) -> Self {
        let runtimes = config.handlers.iter().map(|(name, h)| (name.clone(), h.oci().clone()));
        Self::with_runtimes(&config.root, runtimes)
    }

    /// A reality over the store root `root` with explicit runtimes by handler name.
    pub fn with_runtimes(root: impl Into<PathBuf>, runtimes: impl IntoIterator<Item = (String, OciRuntime)>) -> Self {
        HostReality { root: root.into(), runtimes: runtimes.into_iter().collect() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `exit.json` as an observation: `None` while there is none.
    fn recorded_exit(dir: &Path) -> Option<Observed> {
        match berth_monitor::read_exit(dir) {
            Ok(Some(exit)) => Some(Observed::Exited {
                exit_code: exit.exit_code,
                finished_at: parse_rfc3339_ns(&exit.finished_at).unwrap_or(0),
                oom_killed: exit.oom_killed,
            }),
            Ok(None) => None,
            Err(e) => Some(Observed::Unknown { reason: berth_common::error::error_chain(&e) }),
        }
    }

    /// Waits up to [`EXIT_GRACE`] for a live monitor to record the exit of a container the OCI
    /// runtime no longer runs.
    fn exit_of_ended(dir: &Path, monitor_pid: Option<i32>, what: &str) -> Observed {
        let Some(pid) = monitor_pid else { return Observed::Gone };
        let deadline = Instant::now() + EXIT_GRACE;
        loop {
            if let Some(observed) = Self::recorded_exit(dir) {
                return observed;
            }
            if !berth_monitor::is_alive(pid) {
                // It may have written the file just before exiting.
                return Self::recorded_exit(dir).unwrap_or(Observed::Gone);
            }
            if Instant::now() >= deadline {
                return Observed::Unknown {
                    reason: format!("the container is {what} but its monitor (pid {pid}) has not recorded its exit"),
                };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Reality for HostReality {
    fn container_status(&self, record: &ContainerRecord) -> Observed {
        let dir = monitor_dir(&self.root, &record.id);
        if let Some(observed) = Self::recorded_exit(&dir) {
            return observed;
        }
        let recorded_monitor = match berth_monitor::read_monitor_pid(&dir) {
            Ok(pid) => pid,
            Err(e) => return Observed::Unknown { reason: berth_common::error::error_chain(&e) },
        };
        if recorded_monitor.is_none() && record.state() == ContainerState::Created {
            // Never started: the OCI container is made by StartContainer. It can still start if
            // its rootfs is there (not after a reboot).
            return if crate::host::is_mounted(&record.bundle.join("rootfs")) {
                Observed::Created { pid: None }
            } else {
                Observed::Gone
            };
        }
        let monitor_pid = recorded_monitor.filter(|pid| berth_monitor::is_alive(*pid));
        let Some(runtime) = self.runtimes.get(&record.handler) else {
            return Observed::Unknown { reason: format!("runtime handler {:?} is not configured", record.handler) };
        };
        let pid = |p: Option<u32>| p.and_then(|p| i32::try_from(p).ok());
        match runtime.state(&record.id) {
            Ok(state) => match state.status {
                Status::Creating | Status::Created => Observed::Created { pid: pid(state.pid) },
                Status::Running | Status::Paused => match pid(state.pid) {
                    Some(pid) => Observed::Running { pid },
                    None => Observed::Unknown {
                        reason: format!("the OCI runtime reports the container {} without a pid", state.status),
                    },
                },
                Status::Stopped => Self::exit_of_ended(&dir, monitor_pid, "stopped"),
            },
            Err(OciError::NotFound { .. }) => Self::exit_of_ended(&dir, monitor_pid, "unknown to the OCI runtime"),
            Err(e) => Observed::Unknown { reason: berth_common::error::error_chain(&e) },
        }
    }

    fn sandbox_status(&self, record: &SandboxRecord) -> ObservedSandbox {
        if let Some(netns) = &record.netns_path {
            match is_netns(netns) {
                Ok(true) => {}
                Ok(false) => return ObservedSandbox::Gone,
                Err(e) => {
                    return ObservedSandbox::Unknown { reason: format!("checking netns {}: {e}", netns.display()) };
                }
            }
        }
        if let Some(pid) = record.infra_pid {
            match process_alive(pid) {
                Ok(true) => {}
                Ok(false) => return ObservedSandbox::Gone,
                Err(e) => return ObservedSandbox::Unknown { reason: format!("checking infra process {pid}: {e}") },
            }
        }
        ObservedSandbox::Alive
    }
}

/// Whether `path` is a mounted network namespace: it exists and lives on nsfs, the file system
/// of `/proc/self/ns/net` (an unmounted bind target is a plain file of its parent's file system).
pub fn is_netns(path: &Path) -> io::Result<bool> {
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let nsfs = fs::metadata("/proc/self/ns/net")?;
    Ok(meta.dev() == nsfs.dev())
}

/// Whether `pid` is a process that has not exited (a zombie has).
pub fn process_alive(pid: i32) -> io::Result<bool> {
    if pid <= 0 {
        return Ok(false);
    }
    let stat = match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat,
        Err(e) if matches!(e.kind(), io::ErrorKind::NotFound) || e.raw_os_error() == Some(3) => return Ok(false),
        Err(e) => return Err(e),
    };
    // "<pid> (<comm>) <state> ...": comm may hold ')', so the state follows the last one.
    let state = stat.rfind(')').and_then(|close| stat[close + 1..].trim_start().chars().next());
    Ok(!matches!(state, None | Some('Z' | 'X' | 'x')))
}

/// Parses an RFC 3339 timestamp (`2025-01-01T00:00:00.123456789Z`, any number of fraction digits,
/// `Z` or a `±HH:MM` offset, `t`/`z`/space accepted) into nanoseconds since the Unix epoch.
pub fn parse_rfc3339_ns(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let digits = b.get(range)?;
        digits.iter().try_fold(0i64, |n, d| d.is_ascii_digit().then(|| n * 10 + i64::from(d - b'0')))
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' {
        return None;
    }
    if b[16] != b':' {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=days_in_month(year, month)).contains(&day) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut i = 19;
    let mut nanos = 0i64;
    if b[i] == b'.' {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            if i - start < 9 {
                nanos = nanos * 10 + i64::from(b[i] - b'0');
            }
            i += 1;
        }
        let digits = i - start;
        if digits == 0 {
            return None;
        }
        for _ in digits..9 {
            nanos *= 10;
        }
    }
    let offset = match b.get(i..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (h, m) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if h > 23 || m > 59 {
                return None;
            }
            let minutes = h * 60 + m;
            if *sign == b'+' { minutes } else { -minutes }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset * 60;
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (the era-based algorithm: eras of 400
/// years, years starting in March so that the leap day falls last).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use std::time::{SystemTime, UNIX_EPOCH};

    use berth_monitor::ContainerExit;
    use berth_oci::runtime::RecordingSpawner;

    use std::sync::Arc;

    use super::*;
    use crate::state::ExitReason;
    use crate::state::{Exit, UNKNOWN_EXIT_CODE, decide_container};

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn record(handler: &str) -> ContainerRecord {
        let mut r = ContainerRecord::default();
        r.id = ID.into();
        r.handler = handler.into();
        r
    }

    /// A reality over a fresh root whose `runc` handler answers with `replies` (exit code, stdout,
    /// stderr) in order.
    fn reality(replies: &[(i32, &str, &str)]) -> (tempfile::TempDir, HostReality, Arc<RecordingSpawner>) {
        let dir = tempfile::tempdir().unwrap();
        let spawner = Arc::new(RecordingSpawner::new());
        for (code, out, err) in replies {
            spawner.reply(*code, out, err);
        }
        let runc = OciRuntime::new("runc", spawner.clone());
        let reality = HostReality::with_runtimes(dir.path(), [("runc".to_string(), runc)]);
        (dir, reality, spawner)
    }

    fn write_exit(root: &Path, exit: &ContainerExit) {
        let dir = monitor_dir(root, ID);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(berth_monitor::EXIT_FILE), serde_json::to_vec(exit).unwrap()).unwrap();
    }

    const RUNC_GONE: (i32, &str, &str) = (1, "", "container does not exist");

    #[test]
    fn the_monitor_dir_is_inside_the_container_record_dir() {
        assert_eq!(
            monitor_dir(Path::new("/var/lib/berth/runtime"), "abc"),
            Path::new("/var/lib/berth/runtime/containers/abc/monitor")
        );
    }

    #[test]
    fn an_exit_json_is_an_exit_with_its_code_time_and_oom_flag() {
        let (dir, reality, spawner) = reality(&[]);
        let exit = ContainerExit {
            exit_code: 137,
            signal: Some(9),
            finished_at: "2025-01-01T00:00:01.000000002Z".into(),
            oom_killed: true,
        };
        write_exit(dir.path(), &exit);
        let observed = reality.container_status(&record("runc"));
        let expected_ns = 1_735_689_601_000_000_002;
        assert_eq!(observed, Observed::Exited { exit_code: 137, finished_at: expected_ns, oom_killed: true });
        assert!(spawner.calls().is_empty(), "an exit on disk needs no OCI runtime");

        // Through the rules (a default record is `unknown`, which an exit still ends), the reasons.
        let running = record("runc");
        let reason = |code, oom| {
            let observed = Observed::Exited { exit_code: code, finished_at: 5, oom_killed: oom };
            match decide_container(&running, &observed, 9) {
                Some(crate::state::ContainerFix::Exited(Exit { reason, .. })) => reason,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(reason(137, true), ExitReason::OomKilled);
        assert_eq!(reason(0, false), ExitReason::Completed);
        assert_eq!(reason(1, false), ExitReason::Error);
    }

    #[test]
    fn an_exit_with_an_unparsable_time_has_time_zero() {
        let (dir, reality, _) = reality(&[]);
        let exit = ContainerExit { exit_code: 0, signal: None, finished_at: "yesterday".into(), oom_killed: false };
        write_exit(dir.path(), &exit);
        let observed = reality.container_status(&record("runc"));
        assert_eq!(observed, Observed::Exited { exit_code: 0, finished_at: 0, oom_killed: false });
    }

    #[test]
    fn nothing_on_disk_and_unknown_to_the_runtime_is_gone() {
        let (_dir, reality, spawner) = reality(&[RUNC_GONE]);
        assert_eq!(reality.container_status(&record("runc")), Observed::Gone);
        assert_eq!(spawner.last_args(), ["state", ID]);
    }

    #[test]
    fn stopped_without_a_monitor_or_its_exit_is_gone() {
        let stopped = format!(r#"{{"ociVersion":"1.0.2","id":"{ID}","status":"stopped","pid":0,"bundle":"/b"}}"#);
        let (_dir, reality, _) = reality(&[(0, &stopped, "")]);
        assert_eq!(reality.container_status(&record("runc")), Observed::Gone);
    }

    #[test]
    fn a_corrupt_exit_json_is_unknown() {
        let (dir, reality, _) = reality(&[RUNC_GONE]);
        let mdir = monitor_dir(dir.path(), ID);
        fs::create_dir_all(&mdir).unwrap();
        fs::write(mdir.join(berth_monitor::EXIT_FILE), b"{\"exit_code\":").unwrap();
        let Observed::Unknown { reason } = reality.container_status(&record("runc")) else { panic!() };
        assert!(reason.contains("exit.json"), "{reason}");
    }

    #[test]
    fn the_runtime_state_maps_to_created_and_running() {
        let state = |status: &str, pid: i64| {
            format!(r#"{{"ociVersion":"1.0.2","id":"{ID}","status":"{status}","pid":{pid},"bundle":"/b"}}"#)
        };
        let (created, running, paused) = (state("created", 41), state("running", 42), state("paused", 43));
        let (_dir, reality, _) = reality(&[(0, &created, ""), (0, &running, ""), (0, &paused, "")]);
        let r = record("runc");
        assert_eq!(reality.container_status(&r), Observed::Created { pid: Some(41) });
        assert_eq!(reality.container_status(&r), Observed::Running { pid: 42 });
        assert_eq!(reality.container_status(&r), Observed::Running { pid: 43 });
    }

    #[test]
    fn runtime_failures_and_unknown_handlers_are_unknown() {
        let (_dir, reality, _) = reality(&[(1, "", "permission denied"), (0, "not json", "")]);
        let r = record("runc");
        for _ in 0..2 {
            assert!(matches!(reality.container_status(&r), Observed::Unknown { .. }));
        }
        let Observed::Unknown { reason } = reality.container_status(&record("kata")) else { panic!() };
        assert!(reason.contains("kata"), "{reason}");
    }

    #[test]
    fn a_gone_observation_becomes_the_unknown_exit() {
        let (_dir, reality, _) = reality(&[RUNC_GONE]);
        let r = record("runc");
        let observed = reality.container_status(&r);
        let Some(crate::state::ContainerFix::Exited(exit)) = decide_container(&r, &observed, 7) else { panic!() };
        assert_eq!((exit.code, exit.reason), (UNKNOWN_EXIT_CODE, ExitReason::Unknown));
    }

    #[test]
    fn sandboxes_are_alive_while_their_netns_and_infra_process_are() {
        let (dir, reality, _) = reality(&[]);
        let mut s = SandboxRecord::default();
        assert_eq!(reality.sandbox_status(&s), ObservedSandbox::Alive, "host network, no infra process");

        s.netns_path = Some("/proc/self/ns/net".into());
        s.infra_pid = Some(std::process::id() as i32);
        assert_eq!(reality.sandbox_status(&s), ObservedSandbox::Alive);

        let plain = dir.path().join("netns");
        fs::write(&plain, b"").unwrap();
        s.netns_path = Some(plain);
        assert_eq!(reality.sandbox_status(&s), ObservedSandbox::Gone, "an unmounted bind target");
        s.netns_path = Some(dir.path().join("missing"));
        assert_eq!(reality.sandbox_status(&s), ObservedSandbox::Gone);

        s.netns_path = None;
        s.infra_pid = Some(i32::MAX);
        assert_eq!(reality.sandbox_status(&s), ObservedSandbox::Gone);
    }

    #[test]
    fn a_reaped_or_zombie_process_is_not_alive() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(5);
        while process_alive(pid).unwrap() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!process_alive(pid).unwrap(), "a zombie is not alive");
        child.wait().unwrap();
        assert!(!process_alive(pid).unwrap());
        assert!(!process_alive(0).unwrap());
    }

    #[test]
    fn rfc3339_timestamps_parse_to_nanoseconds() {
        assert_eq!(parse_rfc3339_ns("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339_ns("1970-01-01T00:00:00.5Z"), Some(500_000_000));
        assert_eq!(parse_rfc3339_ns("2000-02-29T12:00:00.000000001Z"), Some(951_825_600_000_000_001));
        assert_eq!(parse_rfc3339_ns("2000-02-29T14:00:00.000000001+02:00"), Some(951_825_600_000_000_001));
        assert_eq!(parse_rfc3339_ns("2000-02-29T11:30:00.000000001-00:30"), Some(951_825_600_000_000_001));
        assert_eq!(parse_rfc3339_ns("2000-02-29T12:00:00.0000000019Z"), Some(951_825_600_000_000_001));
        for bad in [
            "",
            "2001-02-29T00:00:00Z",
            "2000-13-01T00:00:00Z",
            "2000-01-01T00:00:00",
            "2000-01-01T00:00:00.Z",
            "2000-01-01T24:00:00Z",
            "2000-01-01T00:00:00Zx",
            "2000-01-01T00:00:00+0100",
        ] {
            assert_eq!(parse_rfc3339_ns(bad), None, "{bad}");
        }
    }

    #[test]
    fn timestamps_the_monitor_writes_round_trip() {
        for secs in [0u64, 86_399, 951_782_400, 1_234_567_890, 1_735_689_599, 4_107_542_400] {
            let t = UNIX_EPOCH + Duration::new(secs, 123_456_789);
            let text = berth_monitor::time::rfc3339_nano(t);
            assert_eq!(parse_rfc3339_ns(&text), Some(secs as i64 * 1_000_000_000 + 123_456_789), "{text}");
        }
        let now = SystemTime::now();
        let ns = now.duration_since(UNIX_EPOCH).unwrap().as_nanos() as i64;
        assert_eq!(parse_rfc3339_ns(&berth_monitor::time::rfc3339_nano(now)), Some(ns));
    }
}
