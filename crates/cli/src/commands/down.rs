//! `berth down`: stops the cluster `berth up` started in a data dir, through its supervisor.
//!
//! The supervisor's pid comes from `D/up.pid` and is checked in `/proc` (a live
//! `berth up --foreground` holding the data dir's lock) before it is signalled: SIGTERM, or
//! SIGUSR1 with `--stop-pods`. The supervisor stops agent, server and runtime in that order
//! (with `--stop-pods`, every pod is stopped and removed through CRI before the server and
//! runtime stop); `berth down` waits for it to exit.
//!
//! `--stop-pods` on a cluster that is already down (containers kept running by an earlier
//! `berth down`) starts the data dir's runtime alone for as long as it takes to stop and remove
//! every pod. With `--stop-pods`, the pods' volumes left mounted under the agent's dir are
//! unmounted, the bridge of the pod network `berth up` wrote goes too, once no pod is left on
//! it, and so do the Service proxy's table and the routes to other nodes' pods.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rustix::process::{Pid, Signal, kill_process};

use super::up::health::runtime_status;
use super::up::layout::{DEFAULT_DATA_DIR, Layout, State, live_supervisor, process_alive};
use super::up::supervisor::{remove_every_pod, spawn};

#[derive(clap::Args)]
pub struct Args {
    /// The data dir `berth up` ran with.
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// Also stop and remove every pod's containers (they keep running otherwise, and the next
    /// `berth up` picks them up again).
    #[arg(long)]
    stop_pods: bool,
    /// How long to wait for the supervisor to exit, in seconds.
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    timeout: u64,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let layout = Layout::new(&args.data_dir)?;
    let Some(pid) = live_supervisor(&layout) else {
        let _ = std::fs::remove_file(layout.pidfile());
        if args.stop_pods
            && let Some(state) = State::read(&layout)
        {
            let removed = stop_pods_while_down(&layout, &state.runtime_socket, args.timeout).await?;
            unmount_pod_volumes(&layout);
            remove_bridge(&layout);
            remove_service_rules(&layout).await;
            println!("berth was down; its runtime stopped and removed {removed} pod(s)");
        } else {
            println!("berth is not up in {}; nothing to stop", layout.data_dir.display());
        }
        return Ok(());
    };
    let signal = if args.stop_pods { Signal::USR1 } else { Signal::TERM };
    let target = Pid::from_raw(pid as i32).context("invalid pid in the pidfile")?;
    kill_process(target, signal).with_context(|| format!("cannot signal the supervisor (pid {pid})"))?;
    println!(
        "berth down: stopping agent, server and runtime{} (supervisor pid {pid})",
        if args.stop_pods { ", and every pod" } else { "" }
    );
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    while process_alive(pid) {
        if Instant::now() > deadline {
            anyhow::bail!(
                "the supervisor (pid {pid}) is still stopping after {}s; see {}",
                args.timeout,
                layout.log("up").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = std::fs::remove_file(layout.pidfile());
    if args.stop_pods {
        unmount_pod_volumes(&layout);
        remove_bridge(&layout);
        remove_service_rules(&layout).await;
        remove_pod_routes().await;
        println!("berth is down; every pod was stopped and removed");
    } else {
        println!("berth is down; containers keep running and `berth up{}` picks them up again", layout.flag());
    }
    Ok(())
}

/// Starts the data dir's runtime (unless one already answers on `socket`), stops and removes
/// every pod through it, and stops it again.
async fn stop_pods_while_down(layout: &Layout, socket: &Path, timeout: u64) -> anyhow::Result<usize> {
    if runtime_status(socket).await.is_ok() {
        return remove_every_pod(socket).await;
    }
    let config = layout.runtime_config();
    anyhow::ensure!(config.exists(), "no runtime config at {}: berth up never ran here", config.display());
    let exe = std::env::current_exe().context("cannot find the berth binary")?;
    let args: Vec<OsString> = vec!["runtime".into(), "--config".into(), config.into_os_string()];
    let mut runtime = spawn(&exe, &args, &layout.log("runtime"))?;
    let deadline = Instant::now() + Duration::from_secs(timeout);
    let removed = async {
        while runtime_status(socket).await.is_err() {
            if let Some(status) = runtime.try_wait()? {
                anyhow::bail!("the runtime exited ({status}); see {}", layout.log("runtime").display());
            }
            anyhow::ensure!(Instant::now() < deadline, "the runtime did not answer on {}", socket.display());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        remove_every_pod(socket).await
    }
    .await;
    if let Some(pid) = runtime.id().and_then(|p| Pid::from_raw(p as i32)) {
        let _ = kill_process(pid, Signal::TERM);
    }
    let _ = tokio::time::timeout(Duration::from_secs(30), runtime.wait()).await;
    let _ = runtime.start_kill();
    removed
}

/// Deletes the bridge of the pod network `berth up` wrote (`D/runtime/cni/net.d`), if it exists.
/// The agent unmounts a pod's memory-backed volumes when it removes the pod itself; pods removed
/// through CRI while it is stopped leave theirs mounted under its root dir.
fn unmount_pod_volumes(layout: &Layout) {
    if let Err(e) = berth_agent::pods::unmount_all_under(&layout.agent_dir()) {
        eprintln!("cannot unmount the pods' volumes under {}: {e}", layout.agent_dir().display());
    }
}

/// Removes the Service proxy's nftables table (the agent leaves it when it stops, so Services keep
/// working for the containers that keep running).
async fn remove_service_rules(layout: &Layout) {
    let table = layout.proxy_table();
    if let Err(e) = berth_proxy::remove_table(Path::new("nft"), &table).await {
        eprintln!("cannot remove the service proxy's nftables table {table}: {e}");
    }
}

/// Removes the agent's routes to other nodes' pods (it leaves them when it stops, for the same
/// reason as the proxy's table).
async fn remove_pod_routes() {
    match berth_agent::network::routes::remove_all_routes().await {
        Ok(0) => {}
        Ok(n) => println!("removed {n} route(s) to other nodes' pods"),
        Err(e) => eprintln!("cannot remove the routes to other nodes' pods: {e}"),
    }
}

fn remove_bridge(layout: &Layout) {
    let Some(bridge) = bridge_of(&layout.cni_conf_dir()) else { return };
    if Path::new("/sys/class/net").join(&bridge).exists() {
        match std::process::Command::new("ip").args(["link", "del", &bridge]).output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!("cannot delete bridge {bridge}: {}", String::from_utf8_lossy(&out.stderr).trim()),
            Err(e) => eprintln!("cannot delete bridge {bridge}: {e}"),
        }
    }
}

/// The bridge named by the first bridge plugin of the conflists in `dir`.
fn bridge_of(dir: &Path) -> Option<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir).ok()?.flatten().map(|e| e.path()).collect();
    files.sort();
    files.iter().find_map(|path| {
        let list: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
        let plugins = list["plugins"].as_array()?;
        plugins.iter().find(|p| p["type"] == "bridge")?["bridge"].as_str().map(str::to_owned)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bridge_comes_from_the_written_conflist() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(bridge_of(dir.path()), None);
        let list = serde_json::json!({"cniVersion": "1.0.0", "name": "berth", "plugins": [
            {"type": "bridge", "bridge": "berth7", "ipam": {"type": "host-local"}},
            {"type": "portmap"},
        ]});
        std::fs::write(dir.path().join("10-berth7.conflist"), list.to_string()).unwrap();
        assert_eq!(bridge_of(dir.path()).as_deref(), Some("berth7"));
    }
}
