//! Runtime discovery: which OCI runtimes really run containers on this machine.
//!
//! The candidates are runc (handler `runc`), crun (`crun`) and runsc (`gvisor`, on ptrace with the
//! pod's network namespace as its network) found on PATH, and every handler of
//! `/etc/berth/runtime.toml` when that file exists (its settings win for a name they share).
//! Each is proved by running a tiny container with the OCI runtime directly: a rootfs holding
//! only the static `/bin/busybox`, `true` as the process, in fresh namespaces, timed. For gVisor
//! a second container (`sleep`) runs detached while the resident memory of its sandbox
//! processes (sentry and gofer) is summed: the RuntimeClass's `overhead.podFixed`. A runtime
//! that fails gets its error and, when the error is a known one, the fix.
//!
//! The handlers that work go into the runtime's config ([`runtime_toml`]), which `berth up`
//! rewrites on each start; the rest are left out until they can run here.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use super::preflight::{BUSYBOX, Cgroups};

/// The runtimes looked for on PATH: (handler, binary, global args).
const KNOWN: [(&str, &str, &[&str]); 3] =
    [("runc", "runc", &[]), ("crun", "crun", &[]), ("gvisor", "runsc", &["--platform=ptrace", "--network=host"])];
/// How long one probe container may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// gVisor's overhead is rounded up to a multiple of this.
const OVERHEAD_STEP: u64 = 8 << 20;

/// A runtime handler to probe.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub handler: String,
    /// As configured (a name on PATH or an absolute path).
    pub binary: PathBuf,
    /// The executable found for it.
    pub resolved: Option<PathBuf>,
    pub args: Vec<String>,
    /// `PATH` or the config file it came from.
    pub from: String,
    /// The handler's other settings in the config file (platform, privileged, ...), kept as
    /// written.
    pub settings: toml::Table,
}

impl Candidate {
    /// gVisor: its sandbox is a VM-like kernel whose footprint is the pod's overhead.
    pub fn is_gvisor(&self) -> bool {
        match self.settings.get("isolation").and_then(toml::Value::as_str) {
            Some(isolation) => isolation == "sandbox-per-container",
            None => self.binary.file_name().is_some_and(|n| n.to_string_lossy().contains("runsc")),
        }
    }
}

/// The result for one handler, as `berth up` reports it and `berth status` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    pub handler: String,
    pub binary: PathBuf,
    pub from: String,
    pub outcome: Outcome,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "lowercase")]
pub enum Outcome {
    /// Ran `true` in a container in `run_ms`; for gVisor, its sandbox's resident memory.
    Works {
        run_ms: f64,
        sandbox_rss_bytes: Option<u64>,
    },
    Fails {
        error: String,
        fix: String,
    },
}

impl Probe {
    pub fn works(&self) -> bool {
        matches!(self.outcome, Outcome::Works { .. })
    }

    /// The pod overhead (memory) for the handler's RuntimeClass: the sandbox's RSS rounded up
    /// to a multiple of 8 MiB, as a Kubernetes quantity.
    pub fn overhead_memory(&self) -> Option<String> {
        match self.outcome {
            Outcome::Works { sandbox_rss_bytes: Some(rss), .. } => Some(format!("{}Mi", round_up(rss) >> 20)),
            _ => None,
        }
    }

    /// One line for the user: `runc (/usr/sbin/runc): runs a container in 24 ms`.
    pub fn summary(&self) -> String {
        let who = format!("{} ({})", self.handler, self.binary.display());
        match &self.outcome {
            Outcome::Works { run_ms, sandbox_rss_bytes: None } => format!("{who}: runs a container in {run_ms:.0} ms"),
            Outcome::Works { run_ms, sandbox_rss_bytes: Some(rss) } => format!(
                "{who}: runs a container in {run_ms:.0} ms; its sandbox takes {:.1} MiB (pod overhead {})",
                *rss as f64 / (1 << 20) as f64,
                self.overhead_memory().unwrap_or_default()
            ),
            Outcome::Fails { error, fix } => format!("{who}: cannot run a container here: {error}; fix: {fix}"),
        }
    }
}

fn round_up(bytes: u64) -> u64 {
    bytes.div_ceil(OVERHEAD_STEP).max(1) * OVERHEAD_STEP
}

/// The handlers to probe: the known runtimes on `search_path`, then the handlers of the config
/// file `(path, text)`, which win for a name they share.
pub fn candidates(file: Option<(&Path, &str)>, search_path: &OsStr) -> anyhow::Result<Vec<Candidate>> {
    let mut out: Vec<Candidate> = KNOWN
        .iter()
        .filter_map(|(handler, binary, args)| {
            let resolved = berth_runtime::config::find_on_path(binary, search_path)?;
            Some(Candidate {
                handler: handler.to_string(),
                binary: PathBuf::from(binary),
                resolved: Some(resolved),
                args: args.iter().map(|a| a.to_string()).collect(),
                from: "PATH".into(),
                settings: toml::Table::new(),
            })
        })
        .collect();
    let Some((path, text)) = file else { return Ok(out) };
    let table: toml::Table = toml::from_str(text).with_context(|| format!("cannot parse {}", path.display()))?;
    let handlers = table.get("handlers").and_then(toml::Value::as_table).cloned().unwrap_or_default();
    for (handler, settings) in handlers {
        let mut settings = settings
            .as_table()
            .cloned()
            .with_context(|| format!("{}: handlers.{handler} is not a table", path.display()))?;
        let binary = settings
            .remove("binary")
            .and_then(|b| b.as_str().map(PathBuf::from))
            .with_context(|| format!("{}: handlers.{handler}.binary is missing", path.display()))?;
        let args = match settings.remove("args") {
            Some(toml::Value::Array(a)) => a.iter().filter_map(|v| v.as_str().map(String::from)).collect(),
            _ => Vec::new(),
        };
        let resolved = if binary.is_absolute() {
            binary.exists().then(|| binary.clone())
        } else {
            berth_runtime::config::find_on_path(&binary.to_string_lossy(), search_path)
        };
        let candidate =
            Candidate { handler: handler.clone(), binary, resolved, args, from: path.display().to_string(), settings };
        match out.iter_mut().find(|c| c.handler == handler) {
            Some(known) => *known = candidate,
            None => out.push(candidate),
        }
    }
    Ok(out)
}

/// The `[registries]` of the config file, kept in the runtime config `berth up` writes.
pub fn registries(text: &str) -> toml::Table {
    toml::from_str::<toml::Table>(text)
        .ok()
        .and_then(|t| t.get("registries").and_then(toml::Value::as_table).cloned())
        .unwrap_or_default()
}

/// Proves every candidate in turn (one at a time, so the timings are not disturbed).
pub async fn probe_all(candidates: &[Candidate], scratch: &Path, cgroups: &Cgroups) -> Vec<Probe> {
    let mut probes = Vec::new();
    for c in candidates {
        let outcome = match &c.resolved {
            None => Outcome::Fails {
                error: format!("{} not found", c.binary.display()),
                fix: format!("install it, or correct handlers.{}.binary in {}", c.handler, c.from),
            },
            Some(binary) => {
                let dir = scratch.join(&c.handler);
                let outcome = probe(c, binary, &dir, cgroups).await;
                let _ = std::fs::remove_dir_all(&dir);
                outcome
            }
        };
        let binary = c.resolved.clone().unwrap_or_else(|| c.binary.clone());
        probes.push(Probe { handler: c.handler.clone(), binary, from: c.from.clone(), outcome });
    }
    let _ = std::fs::remove_dir(scratch);
    probes
}

async fn probe(c: &Candidate, binary: &Path, dir: &Path, cgroups: &Cgroups) -> Outcome {
    let fails = |error: String| Outcome::Fails { fix: fix_for(c, &error, cgroups), error };
    let _ = std::fs::remove_dir_all(dir);
    let state = dir.join("state");
    let bundle = dir.join("true");
    if let Err(e) = write_bundle(&bundle, &["/bin/true"]) {
        return fails(format!("cannot write a test bundle in {}: {e:#}", bundle.display()));
    }
    let oci = Oci { binary, args: &c.args, state: &state };
    let id = format!("berth-probe-{}-{}", c.handler, std::process::id());
    let started = Instant::now();
    let ran = oci.run(&["run", "--bundle", &bundle.to_string_lossy(), &id]).await;
    let run_ms = started.elapsed().as_secs_f64() * 1000.0;
    oci.run(&["delete", "--force", &id]).await.ok();
    if let Err(error) = ran {
        return fails(error);
    }
    let sandbox_rss_bytes = if c.is_gvisor() {
        match sandbox_rss(&oci, dir, &c.handler).await {
            Ok(rss) => Some(rss),
            Err(error) => return fails(format!("measuring its sandbox: {error}")),
        }
    } else {
        None
    };
    Outcome::Works { run_ms, sandbox_rss_bytes }
}

/// Runs `sleep` detached and sums the resident memory of the processes of its sandbox.
async fn sandbox_rss(oci: &Oci<'_>, dir: &Path, handler: &str) -> Result<u64, String> {
    let bundle = dir.join("sleep");
    write_bundle(&bundle, &["/bin/sleep", "60"]).map_err(|e| format!("{e:#}"))?;
    let id = format!("berth-probe-{handler}-rss-{}", std::process::id());
    let result = async {
        oci.run(&["run", "--detach", "--bundle", &bundle.to_string_lossy(), &id]).await?;
        let deadline = Instant::now() + PROBE_TIMEOUT;
        loop {
            let state = oci.run(&["state", &id]).await.unwrap_or_default();
            if state.contains("\"running\"") {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("the container did not reach running: {state}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Let the sandbox finish booting before it is weighed.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rss = tree_rss(&bundle.to_string_lossy());
        if rss == 0 { Err("found no sandbox process".to_string()) } else { Ok(rss) }
    }
    .await;
    oci.run(&["kill", &id, "KILL"]).await.ok();
    oci.run(&["delete", "--force", &id]).await.ok();
    result
}

/// The summed VmRSS of the processes whose command line mentions `marker` and of their
/// descendants.
fn tree_rss(marker: &str) -> u64 {
    let mut procs = Vec::new(); // (pid, ppid, mentions marker, rss)
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { continue };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let mentions = String::from_utf8_lossy(&cmdline).contains(marker);
        procs.push((pid, field("PPid:").unwrap_or(0) as u32, mentions, field("VmRSS:").unwrap_or(0) * 1024));
    }
    let mut members: BTreeSet<u32> = procs.iter().filter(|p| p.2).map(|p| p.0).collect();
    loop {
        let more: Vec<u32> =
            procs.iter().filter(|p| members.contains(&p.1) && !members.contains(&p.0)).map(|p| p.0).collect();
        if more.is_empty() {
            break;
        }
        members.extend(more);
    }
    procs.iter().filter(|p| members.contains(&p.0)).map(|p| p.3).sum()
}

/// One OCI runtime binary with its global args and a state root of the probe's own.
struct Oci<'a> {
    binary: &'a Path,
    args: &'a [String],
    state: &'a Path,
}

impl Oci<'_> {
    /// Runs a subcommand; its stdout, or its error (exit status and output) as one line.
    ///
    /// Output goes through files, not pipes: a detached container (or gVisor's sandbox) keeps
    /// what it inherited open long after the command returned.
    async fn run(&self, args: &[&str]) -> Result<String, String> {
        let files = self.state.parent().unwrap_or(self.state);
        let (out_path, err_path) = (files.join("stdout"), files.join("stderr"));
        let open =
            |path: &Path| std::fs::File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()));
        let mut command = tokio::process::Command::new(self.binary);
        command
            .args(self.args)
            .arg("--root")
            .arg(self.state)
            .args(args)
            .stdin(Stdio::null())
            .stdout(open(&out_path)?)
            .stderr(open(&err_path)?)
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|e| format!("cannot start {}: {e}", self.binary.display()))?;
        let status = match tokio::time::timeout(PROBE_TIMEOUT, child.wait()).await {
            Err(_) => return Err(format!("`{} {}` did not finish within {PROBE_TIMEOUT:?}", self.name(), args[0])),
            Ok(Err(e)) => return Err(format!("waiting for {}: {e}", self.binary.display())),
            Ok(Ok(status)) => status,
        };
        let (stdout, stderr) =
            (std::fs::read(&out_path).unwrap_or_default(), std::fs::read(&err_path).unwrap_or_default());
        if status.success() {
            return Ok(String::from_utf8_lossy(&stdout).into_owned());
        }
        let output = std::process::Output { status, stdout, stderr };
        let text = format!("{}\n{}", String::from_utf8_lossy(&output.stderr), String::from_utf8_lossy(&output.stdout));
        let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        let tail = lines[lines.len().saturating_sub(3)..].join(" / ");
        Err(format!("`{} {}` failed ({}): {tail}", self.name(), args[0], output.status))
    }

    fn name(&self) -> String {
        self.binary.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    }
}

/// A bundle whose rootfs is only `/bin/busybox` (with `true` and `sleep` linked to it), read-only,
/// running `args` as root in new pid, mount, ipc, uts and network namespaces.
fn write_bundle(bundle: &Path, args: &[&str]) -> anyhow::Result<()> {
    let bin = bundle.join("rootfs/bin");
    std::fs::create_dir_all(&bin).with_context(|| format!("cannot create {}", bin.display()))?;
    std::fs::copy(BUSYBOX, bin.join("busybox")).with_context(|| format!("cannot copy {BUSYBOX}"))?;
    for applet in ["true", "sleep"] {
        std::fs::hard_link(bin.join("busybox"), bin.join(applet)).context("cannot link a busybox applet")?;
    }
    for dir in ["proc", "dev", "tmp"] {
        std::fs::create_dir_all(bundle.join("rootfs").join(dir))
            .with_context(|| format!("cannot create rootfs/{dir}"))?;
    }
    let config = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": ["PATH=/bin"],
            "cwd": "/",
        },
        "root": {"path": "rootfs", "readonly": true},
        "hostname": "berth-probe",
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"}, {"type": "network"}],
        },
    });
    std::fs::write(bundle.join("config.json"), config.to_string()).context("cannot write config.json")
}

/// How to fix a runtime that failed with `error`, for the failures known on the hosts berth
/// runs on; a generic hint otherwise.
pub fn fix_for(c: &Candidate, error: &str, cgroups: &Cgroups) -> String {
    let name = c.binary.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if error.contains("cgroups in hybrid mode not supported")
        || (name.contains("crun") && cgroups.hybrid_owned().is_some())
    {
        let owned: Vec<&str> =
            cgroups.hybrid_owned().map(|o| o.iter().map(String::as_str).collect()).unwrap_or_default();
        let owned = if owned.is_empty() { "controllers".to_string() } else { owned.join(", ") };
        return format!(
            "this host mounts cgroups in the v1 \"hybrid\" layout and cgroup2 (/sys/fs/cgroup/unified) still \
             owns {owned}, which crun refuses: run scripts/fix-crun-hybrid.sh from berth's source tree (it \
             mounts them as cgroup v1 hierarchies; no reboot), then berth up again"
        );
    }
    if error.contains("cannot run with network enabled in root network namespace") {
        return format!(
            "give runsc --network=host (the pod's network namespace) in handlers.{}.args of {}",
            c.handler, c.from
        );
    }
    if name.contains("runsc") && (error.contains("kvm") || error.contains("systrap")) {
        return format!("use --platform=ptrace in handlers.{}.args of {} on this host", c.handler, c.from);
    }
    if error.contains("systemd") || error.contains("sd-bus") {
        return "use the cgroupfs cgroup driver (remove --systemd-cgroup from the handler's args): this host runs no \
                systemd"
            .to_string();
    }
    format!(
        "check that `{} --version` works and that this {name} supports the kernel; the handler stays out of \
         the runtime's config until it can run a container",
        c.resolved.as_deref().unwrap_or(&c.binary).display()
    )
}

/// Where and how the runtime `berth up` starts is configured.
pub struct RuntimeSettings<'a> {
    pub socket: &'a Path,
    /// The runtime's state root (`D/runtime`).
    pub root: &'a Path,
    /// Parent of the OCI runtimes' own state roots (`<socket dir>/oci`, on tmpfs for
    /// /run/berth): one per handler, so that runtimes of several clusters never share one.
    pub oci_roots: &'a Path,
    pub cni_conf_dir: &'a Path,
    pub cni_bin_dirs: &'a [PathBuf],
    /// `[registries]` kept from /etc/berth/runtime.toml.
    pub registries: toml::Table,
}

/// The handler that pods without a RuntimeClass (and the default RuntimeClass) use: runc when it
/// works, else the first that works.
pub fn default_handler(probes: &[Probe]) -> Option<&str> {
    let working = || probes.iter().filter(|p| p.works());
    working().find(|p| p.handler == "runc").or_else(|| working().next()).map(|p| p.handler.as_str())
}

/// The runtime's TOML config with the handlers that work.
pub fn runtime_toml(s: &RuntimeSettings, candidates: &[Candidate], probes: &[Probe]) -> anyhow::Result<String> {
    use toml::Value;
    let mut handlers = toml::Table::new();
    for c in candidates {
        let Some(probe) = probes.iter().find(|p| p.handler == c.handler && p.works()) else { continue };
        let mut h = toml::Table::new();
        h.insert("binary".into(), Value::String(probe.binary.display().to_string()));
        if !c.args.is_empty() {
            h.insert("args".into(), Value::Array(c.args.iter().cloned().map(Value::String).collect()));
        }
        for (k, v) in &c.settings {
            h.insert(k.clone(), v.clone());
        }
        h.entry("root").or_insert_with(|| Value::String(s.oci_roots.join(&c.handler).display().to_string()));
        handlers.insert(c.handler.clone(), Value::Table(h));
    }
    let default = default_handler(probes).context("no OCI runtime can run a container on this machine")?;
    let mut doc = toml::Table::new();
    doc.insert("socket".into(), Value::String(s.socket.display().to_string()));
    doc.insert("root".into(), Value::String(s.root.display().to_string()));
    doc.insert("default_handler".into(), Value::String(default.to_string()));
    doc.insert("handlers".into(), Value::Table(handlers));
    let mut cni = toml::Table::new();
    cni.insert("conf_dir".into(), Value::String(s.cni_conf_dir.display().to_string()));
    cni.insert(
        "bin_dirs".into(),
        Value::Array(s.cni_bin_dirs.iter().map(|d| Value::String(d.display().to_string())).collect()),
    );
    doc.insert("cni".into(), Value::Table(cni));
    if !s.registries.is_empty() {
        doc.insert("registries".into(), Value::Table(s.registries.clone()));
    }
    let body = toml::to_string(&doc).context("cannot render the runtime config")?;
    Ok(format!(
        "# Written by `berth up` on each start: the OCI runtimes that ran a test container on this machine.\n{body}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_path(bins: &[&str]) -> tempfile::TempDir {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        for b in bins {
            let p = dir.path().join(b);
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        dir
    }

    fn works(handler: &str, rss: Option<u64>) -> Probe {
        Probe {
            handler: handler.into(),
            binary: format!("/usr/bin/{handler}").into(),
            from: "PATH".into(),
            outcome: Outcome::Works { run_ms: 10.0, sandbox_rss_bytes: rss },
        }
    }

    fn fails(handler: &str) -> Probe {
        Probe {
            handler: handler.into(),
            binary: format!("/usr/bin/{handler}").into(),
            from: "PATH".into(),
            outcome: Outcome::Fails { error: "boom".into(), fix: "mend".into() },
        }
    }

    #[test]
    fn the_known_runtimes_on_path_are_candidates_and_the_config_file_adds_and_overrides() {
        let dir = fake_path(&["runc", "runsc", "kata-runtime"]);
        let found = candidates(None, dir.path().as_os_str()).unwrap();
        let names: Vec<_> = found.iter().map(|c| c.handler.as_str()).collect();
        assert_eq!(names, ["runc", "gvisor"]);
        assert_eq!(found[1].args, ["--platform=ptrace", "--network=host"]);
        assert!(found[1].is_gvisor() && !found[0].is_gvisor());
        assert_eq!(found[0].resolved.as_deref(), Some(dir.path().join("runc").as_path()));

        let file = r#"
[handlers.gvisor]
binary = "runsc"
args = ["--platform=ptrace", "--network=none"]
platform = "linux/amd64"
[handlers.kata]
binary = "kata-runtime"
[handlers.ghost]
binary = "/nonexistent/ghost"
[registries."127.0.0.1:5000"]
insecure = true
"#;
        let path = Path::new("/etc/berth/runtime.toml");
        let found = candidates(Some((path, file)), dir.path().as_os_str()).unwrap();
        let names: Vec<_> = found.iter().map(|c| c.handler.as_str()).collect();
        assert_eq!(names, ["runc", "gvisor", "ghost", "kata"]);
        assert_eq!(found[1].args, ["--platform=ptrace", "--network=none"]);
        assert_eq!(found[1].from, "/etc/berth/runtime.toml");
        assert_eq!(found[1].settings["platform"].as_str(), Some("linux/amd64"));
        assert_eq!(found[2].resolved, None);
        assert!(registries(file).contains_key("127.0.0.1:5000"));
    }

    #[test]
    fn crun_on_a_hybrid_host_gets_the_cgroup_fix() {
        let crun = Candidate {
            handler: "crun".into(),
            binary: "crun".into(),
            resolved: Some("/usr/bin/crun".into()),
            args: vec![],
            from: "PATH".into(),
            settings: Default::default(),
        };
        let hybrid =
            Cgroups::V1 { controllers: ["cpu".to_string()].into(), unified: Some(["hugetlb".to_string()].into()) };
        let fix = fix_for(&crun, "cgroups in hybrid mode not supported, drop all controllers from cgroupv2", &hybrid);
        assert!(fix.contains("still owns hugetlb") && fix.contains("scripts/fix-crun-hybrid.sh"), "{fix}");
        let fixed = Cgroups::V1 { controllers: ["cpu".to_string()].into(), unified: Some(BTreeSet::new()) };
        let other = fix_for(&crun, "exit status 1: something else", &fixed);
        assert!(other.starts_with("check that `/usr/bin/crun --version` works"), "{other}");
    }

    #[test]
    fn gvisor_overhead_is_its_sandbox_rounded_up_to_8_mib() {
        assert_eq!(works("gvisor", Some(43 << 20)).overhead_memory().as_deref(), Some("48Mi"));
        assert_eq!(works("gvisor", Some(48 << 20)).overhead_memory().as_deref(), Some("48Mi"));
        assert_eq!(works("gvisor", Some(1)).overhead_memory().as_deref(), Some("8Mi"));
        assert_eq!(works("runc", None).overhead_memory(), None);
    }

    #[test]
    fn the_runtime_config_holds_only_the_handlers_that_work_with_runc_the_default() {
        let dir = fake_path(&["runc", "crun", "runsc"]);
        let found = candidates(None, dir.path().as_os_str()).unwrap();
        let probes = vec![works("runc", None), fails("crun"), works("gvisor", Some(40 << 20))];
        let settings = RuntimeSettings {
            socket: Path::new("/run/berth/runtime.sock"),
            root: Path::new("/var/lib/berth/runtime"),
            oci_roots: Path::new("/run/berth/oci"),
            cni_conf_dir: Path::new("/var/lib/berth/runtime/cni/net.d"),
            cni_bin_dirs: &["/usr/lib/cni".into()],
            registries: toml::Table::new(),
        };
        let text = runtime_toml(&settings, &found, &probes).unwrap();
        let config = berth_runtime::config::Config::from_toml(&text, OsStr::new("")).unwrap();
        assert_eq!(config.handlers.keys().collect::<Vec<_>>(), ["gvisor", "runc"]);
        assert_eq!(config.default_handler, "runc");
        assert_eq!(config.handlers["gvisor"].args, ["--platform=ptrace", "--network=host"]);
        assert_eq!(config.handlers["runc"].root.as_deref(), Some(Path::new("/run/berth/oci/runc")));
        assert_eq!(config.socket, Path::new("/run/berth/runtime.sock"));
        assert_eq!(config.cni.conf_dir, Path::new("/var/lib/berth/runtime/cni/net.d"));

        let no_runc = vec![fails("runc"), works("crun", None)];
        assert_eq!(default_handler(&no_runc), Some("crun"));
        assert!(runtime_toml(&settings, &found, &[fails("runc")]).is_err());
    }
}
