//! The floor no CRI runtime can beat, measured in the same run: the OCI runtime's own `run` of a
//! busybox bundle whose process is `true`, plus one CNI ADD+DEL of the pod network's plugins.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use serde_json::json;

use super::net::CniFloor;

/// `<dir>/bundle`: Debian's static busybox as the rootfs with `true` linked in, and the spec
/// `runc spec` writes (the same default mounts, capabilities and namespaces a CRI container gets
/// in spirit), changed to run `/bin/true` without a terminal.
pub fn write_bundle(dir: &Path) -> anyhow::Result<PathBuf> {
    let bundle = dir.join("bundle");
    for handler in super::HANDLERS {
        std::fs::create_dir_all(dir.join(handler))?;
    }
    berth_testenv::bundle::write_busybox_bundle(&bundle, &["/bin/true"], "floor", json!({}));
    let bin = bundle.join("rootfs/bin");
    std::fs::hard_link(bin.join("busybox"), bin.join("true")).context("linking /bin/true")?;
    std::fs::remove_file(bundle.join("config.json"))?;
    super::net::run("runc", &["spec", "--bundle", &bundle.to_string_lossy()])?;
    let path = bundle.join("config.json");
    let mut spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    spec["process"]["terminal"] = json!(false);
    spec["process"]["args"] = json!(["/bin/true"]);
    std::fs::write(&path, serde_json::to_vec_pretty(&spec)?)?;
    Ok(bundle)
}

/// The raw runtime command line of a handler: `runc`, `crun`, or runsc on the ptrace platform
/// without a network stack (the bundle has its own empty netns, nothing to attach).
pub fn runtime_command(handler: &str, state_root: &Path) -> anyhow::Result<Command> {
    let (binary, args): (&str, &[&str]) = match handler {
        "runc" => ("runc", &[]),
        "crun" => ("crun", &[]),
        "gvisor" => ("runsc", &["--platform=ptrace", "--network=none"]),
        other => anyhow::bail!("no floor for handler {other:?}"),
    };
    let mut command = Command::new(binary);
    command.arg("--root").arg(state_root.join(handler)).args(args);
    Ok(command)
}

/// One floor sample: `X run` of the bundle to its exit, then CNI ADD+DEL.
pub fn sample(
    handler: &str,
    dir: &Path,
    bundle: &Path,
    cni: &CniFloor,
    id: &str,
) -> anyhow::Result<(Duration, Duration)> {
    let run = run(handler, dir, bundle, id)?;
    let started = Instant::now();
    cni.add_del(id)?;
    Ok((run, started.elapsed()))
}

/// `X run` of the bundle as container `id`, timed to its exit.
pub fn run(handler: &str, dir: &Path, bundle: &Path, id: &str) -> anyhow::Result<Duration> {
    let mut command = runtime_command(handler, dir)?;
    command.args(["run", "--bundle"]).arg(bundle).arg(id);
    command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    let started = Instant::now();
    let out = command.output().with_context(|| format!("running the {handler} floor"))?;
    let took = started.elapsed();
    ensure!(out.status.success(), "{handler} run failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    Ok(took)
}
