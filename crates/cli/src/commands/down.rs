//! `berth down`: stops the cluster `berth up` started in a data dir, through its supervisor.
//!
//! The supervisor's pid comes from `D/up.pid` and is checked in `/proc` (a live
//! `berth up --foreground` holding the data dir's lock) before it is signalled: SIGTERM, or
//! SIGUSR1 with `--stop-pods`. The supervisor stops agent, server and runtime in that order
//! (with `--stop-pods`, every pod is stopped and removed through CRI before the server and
//! runtime stop); `berth down` waits for it to exit.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rustix::process::{Pid, Signal, kill_process};

use super::up::layout::{DEFAULT_DATA_DIR, Layout, live_supervisor, process_alive};

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
        println!("berth is not up in {}; nothing to stop", layout.data_dir.display());
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
        println!("berth is down; every pod was stopped and removed");
    } else {
        println!("berth is down; containers keep running and `berth up{}` picks them up again", layout.flag());
    }
    Ok(())
}
