//! `berth-bench cluster`: a whole cluster's control-plane load from `--nodes` hollow nodes in
//! this one process against a real `berth server`, as kubemark measures Kubernetes: pod startup
//! latency, API call latency by verb, scheduling throughput, and the server's memory and CPU
//! over time — for the full size and for 100 nodes with proportionally fewer pods, side by side,
//! on SQLite, etcd or both.
//!
//! Each run starts the release `berth server` (SQLite in the run's directory, or a single-member
//! etcd of its own with `--store etcd`) with its scheduler and controllers in process,
//! `--leader-elect=false` and the node lifecycle controller on (the hollow nodes renew their
//! Leases, so it finds them healthy), compaction every 300 s, a cluster CIDR with room for every
//! node's pod CIDR and no cluster DNS. The bench creates a namespace and the RuntimeClasses
//! `runc`, `crun` and `gvisor`, registers the hollow nodes (see [`hollow`]: handler mixes,
//! zones and a few tainted nodes as the scheduler bench makes them) and waits until each node's
//! watch of its pods is open. Then, with its own watch of all pods open:
//!
//! 1. it creates one Deployment per RuntimeClass, together `--pods` replicas — at once, or
//!    scaled up step by step at `--create-rate` pods per second; the ReplicaSet controller
//!    creates the pods, the scheduler binds them, each hollow node reports its pods Running;
//! 2. meanwhile a sampler GETs a random pod every 100 ms, `GET /api/v1/pods` lists every pod
//!    once half of them run and twice more after all do, and `/proc` gives the server's (the
//!    bench's, etcd's) RSS and CPU every second;
//! 3. once every pod runs (or the run stalls for `--stall-secs`, or `--timeout` is reached), it
//!    holds for `--hold-secs` with only the heartbeats going, then stops the server.
//!
//! Pod startup latency is from the bench's watch first seeing a pod to it seeing the pod
//! Running. API latencies are the bench's own calls (hollow nodes' Lease renewals and status
//! patches, the sampler's GETs, the lists), timed by the bench. Scheduling throughput is pods
//! bound per second from the first pod seen to the last bound, and the busiest second. Figures
//! are printed next to their targets (and written as JSON with `--json`), never asserted.
//! Only processes the bench started are stopped; the run directory is removed unless
//! `--keep-dir`.

mod calls;
mod hollow;
mod observe;
mod report;
mod result;
mod run;
mod usage;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::ensure;

use self::report::Report;
use crate::scheduler::objects;

/// The size of the comparison run.
pub const BASELINE_NODES: usize = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Store {
    Sqlite,
    Etcd,
}

impl Store {
    pub fn name(self) -> &'static str {
        match self {
            Store::Sqlite => "sqlite",
            Store::Etcd => "etcd",
        }
    }
}

#[derive(clap::Args)]
pub struct ClusterArgs {
    /// Hollow nodes of the full run.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Pods of the full run (replicas of the Deployments together).
    #[arg(long, default_value_t = 30_000)]
    pods: usize,
    /// Skip the comparison run on 100 nodes with pods scaled alike.
    #[arg(long)]
    no_baseline: bool,
    /// The server's store.
    #[arg(long, value_enum, default_value = "sqlite")]
    store: Store,
    /// Run on SQLite and on etcd, and print them side by side.
    #[arg(long)]
    both_stores: bool,
    /// Stop and print what there is after this many seconds in all; default: each run is given
    /// time by its size (5 minutes, plus a second per 50 nodes, plus twice the time its pods take
    /// to be created at `--create-rate`, or at 100 pods/s for 0).
    #[arg(long)]
    timeout: Option<u64>,
    /// A run whose pod counts stand still this long is ended.
    #[arg(long, default_value_t = 120)]
    stall_secs: u64,
    /// Seconds with every pod Running and only heartbeats going, before the server is stopped.
    #[arg(long, default_value_t = 20)]
    hold_secs: u64,
    /// Pods per second the Deployments are scaled up at (0: all replicas at once). Kubernetes'
    /// startup SLO is met by clusters whose controllers create pods at a bounded rate (its
    /// controller manager's client allows 20 requests per second by default, and its density
    /// tests create pods at a set throughput); at 0 the run measures how fast the pods can all
    /// be placed, and their startup includes the queue.
    #[arg(long, default_value_t = 100.0)]
    create_rate: f64,
    /// Pod status patches in flight, over all hollow nodes.
    #[arg(long, default_value_t = 64)]
    status_workers: usize,
    /// Lease renewals and node status reports in flight, over all hollow nodes.
    #[arg(long, default_value_t = 512)]
    heartbeat_workers: usize,
    /// Nodes registered at a time.
    #[arg(long, default_value_t = 32)]
    register_concurrency: usize,
    #[arg(long, default_value = "/usr/bin/etcd")]
    etcd_binary: PathBuf,
    /// Keep the run directory (the servers' logs) instead of removing it.
    #[arg(long)]
    keep_dir: bool,
    /// The `berth` binary; default: next to this binary.
    #[arg(long)]
    berth_binary: Option<PathBuf>,
    /// Also write the figures here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One run's size and store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub store: Store,
    pub nodes: usize,
    pub pods: usize,
}

/// The runs of a bench, in order: per store, the 100-node comparison (unless skipped or the
/// full run is no larger) and then the full run.
pub fn plans(stores: &[Store], nodes: usize, pods: usize, baseline: bool) -> Vec<Plan> {
    let mut out = Vec::new();
    for &store in stores {
        if baseline && nodes > BASELINE_NODES {
            out.push(Plan { store, nodes: BASELINE_NODES, pods: (pods * BASELINE_NODES).div_ceil(nodes) });
        }
        out.push(Plan { store, nodes, pods });
    }
    out
}

/// Replicas of each class's Deployment: `pods` split evenly over the classes.
pub fn replicas(pods: usize) -> Vec<usize> {
    let classes = objects::CLASSES.len();
    (0..classes).map(|c| crate::stats::share(pods, classes, c)).collect()
}

/// Replicas of each class's Deployment `elapsed` into a run that scales them up to `pods` in
/// all at `rate` pods per second (at once for 0). Never fewer than a moment before.
pub fn paced_replicas(pods: usize, rate: f64, elapsed: Duration) -> Vec<usize> {
    if rate <= 0.0 {
        return replicas(pods);
    }
    let due = (rate * elapsed.as_secs_f64()).floor();
    replicas(if due >= pods as f64 { pods } else { due as usize })
}

/// The pace assumed for a run that creates all its pods at once: about what one scheduler binds
/// per second on this machine's two cores at 5,000 nodes.
const ASSUMED_BIND_RATE: f64 = 100.0;

/// The time a run of `plan` is given when `--timeout` is not: room to start, register, list and
/// hold, plus twice the time its pods take to be created at `rate` pods per second.
pub fn run_budget(plan: Plan, rate: f64) -> Duration {
    let rate = if rate > 0.0 { rate } else { ASSUMED_BIND_RATE };
    let creating = plan.pods as f64 / rate;
    Duration::from_secs(300 + plan.nodes as u64 / 50) + Duration::from_secs_f64(2.0 * creating)
}

/// Why `pods` could not all fit on `nodes` hollow nodes, if they could not.
pub fn unfit(nodes: usize, pods: usize) -> Option<String> {
    for ((class, handler), n) in objects::CLASSES.iter().zip(replicas(pods)) {
        let room = (0..nodes).filter(|&i| objects::fits(i, handler)).count() * objects::NODE_PODS;
        if n > room {
            return Some(format!("{n} {class} pods exceed the {room} pod slots of {nodes} nodes for it"));
        }
    }
    None
}

pub async fn run(args: ClusterArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    ensure!(
        args.nodes > 0 && args.pods > 0 && args.status_workers > 0,
        "--nodes, --pods and --status-workers must be positive"
    );
    ensure!(args.create_rate >= 0.0 && args.create_rate.is_finite(), "--create-rate must be 0 or more");
    ensure!(
        args.register_concurrency > 0 && args.heartbeat_workers > 0,
        "--register-concurrency and --heartbeat-workers must be positive"
    );
    let stores: Vec<Store> = if args.both_stores { vec![Store::Sqlite, Store::Etcd] } else { vec![args.store] };
    let plans = plans(&stores, args.nodes, args.pods, !args.no_baseline);
    for p in &plans {
        if let Some(why) = unfit(p.nodes, p.pods) {
            anyhow::bail!("{why}");
        }
    }
    let binary = crate::scheduler::controllers_binary(args.berth_binary.as_deref())?;
    if stores.contains(&Store::Etcd) {
        ensure!(
            args.etcd_binary.exists(),
            "no etcd at {} (Debian: apt-get install etcd-server)",
            args.etcd_binary.display()
        );
    }
    run::raise_open_files(args.nodes)?;
    // An explicit --timeout bounds the whole bench; otherwise each run has its own budget.
    let overall = args.timeout.map(|t| started + Duration::from_secs(t));
    let dir = tempfile::Builder::new().prefix("berth-bench-cluster.").tempdir()?;
    eprintln!("run directory {}", dir.path().display());
    let stop = stop_on_signal()?;
    let mut results = Vec::new();
    for plan in &plans {
        let deadline = overall.unwrap_or_else(|| Instant::now() + run_budget(*plan, args.create_rate));
        if Instant::now() + Duration::from_secs(30) > deadline || stop.load(Ordering::SeqCst) {
            eprintln!("{} nodes on {}: not run, --timeout reached or interrupted", plan.nodes, plan.store.name());
            continue;
        }
        eprintln!(
            "{} hollow nodes, {} pods, {} store, ending by {:.0} s from now at the latest",
            plan.nodes,
            plan.pods,
            plan.store.name(),
            deadline.saturating_duration_since(Instant::now()).as_secs_f64()
        );
        let result = run::one(&args, &binary, dir.path(), *plan, deadline, &stop).await;
        eprintln!("  {}", result.summary());
        results.push(result);
    }
    if args.keep_dir {
        let kept = dir.keep();
        eprintln!("run directory kept: {}", kept.display());
    }
    let report = Report { status_workers: args.status_workers, create_rate: args.create_rate, runs: results };
    report.print();
    crate::finish_run(args.json.as_deref(), || report.to_json(), started)
}

/// A flag raised on SIGINT or SIGTERM: the run in progress ends and is printed, later runs are
/// skipped, and every process started is stopped.
fn stop_on_signal() -> anyhow::Result<Arc<AtomicBool>> {
    use tokio::signal::unix::{SignalKind, signal};
    let stop = Arc::new(AtomicBool::new(false));
    let (mut interrupt, mut terminate) = (signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?);
    let flag = stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        eprintln!("interrupted: ending the run, printing what there is");
        flag.store(true, Ordering::SeqCst);
    });
    Ok(stop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_comparison_run_comes_first_with_pods_scaled_alike() {
        let p = plans(&[Store::Sqlite, Store::Etcd], 5000, 150_000, true);
        assert_eq!(p.len(), 4);
        assert_eq!(p[0], Plan { store: Store::Sqlite, nodes: 100, pods: 3000 });
        assert_eq!(p[1], Plan { store: Store::Sqlite, nodes: 5000, pods: 150_000 });
        assert_eq!(p[2].store, Store::Etcd);
        assert_eq!(plans(&[Store::Sqlite], 100, 1000, true).len(), 1, "no comparison with itself");
        assert_eq!(plans(&[Store::Sqlite], 1000, 30_000, false).len(), 1);
    }

    #[test]
    fn a_paced_run_scales_the_deployments_up_evenly_to_the_whole_count() {
        assert_eq!(paced_replicas(900, 0.0, Duration::ZERO), vec![300, 300, 300], "0 is all at once");
        assert_eq!(paced_replicas(900, 100.0, Duration::ZERO), vec![0, 0, 0]);
        assert_eq!(paced_replicas(900, 100.0, Duration::from_millis(1500)), vec![50, 50, 50]);
        assert_eq!(paced_replicas(900, 100.0, Duration::from_millis(1010)).iter().sum::<usize>(), 101);
        assert_eq!(paced_replicas(900, 100.0, Duration::from_secs(60)), vec![300, 300, 300], "never beyond");
        let mut before = vec![0; 3];
        for ms in (0..10_000).step_by(37) {
            let now = paced_replicas(900, 100.0, Duration::from_millis(ms));
            assert!(now.iter().zip(&before).all(|(n, b)| n >= b), "a class never scales down");
            before = now;
        }
    }

    #[test]
    fn a_run_without_a_timeout_is_given_time_by_its_size_and_pace() {
        let full = Plan { store: Store::Sqlite, nodes: 5000, pods: 150_000 };
        assert_eq!(run_budget(full, 100.0), Duration::from_secs(300 + 100 + 3000));
        assert_eq!(run_budget(full, 0.0), run_budget(full, 100.0), "all at once is given the assumed pace");
        let small = Plan { store: Store::Etcd, nodes: 100, pods: 3000 };
        assert_eq!(run_budget(small, 100.0), Duration::from_secs(300 + 2 + 60));
        assert!(run_budget(full, 50.0) > run_budget(full, 100.0), "a slower pace is given longer");
    }

    #[test]
    fn the_pods_are_split_over_the_classes_and_must_fit() {
        assert_eq!(replicas(1000), vec![334, 333, 333]);
        assert_eq!(replicas(1000).iter().sum::<usize>(), 1000);
        assert_eq!(unfit(5000, 150_000), None);
        assert_eq!(unfit(100, 3000), None);
        assert!(unfit(100, 20_000).is_some());
    }
}
