//! The printed tables of `berth-bench scheduler`, its headline figures against the issue's
//! targets, and the JSON.

use std::time::Duration;

use serde_json::{Value, json};

use super::throughput::{Sample, average};
use super::{Arrival, Setup};
use crate::agent::cluster::ProcMemory;
use crate::stats::{Figure, Latencies};

/// Case 1's SchedulingThroughput, at least (pods/s).
pub const THROUGHPUT_TARGET: f64 = 3000.0;
/// Case 1's SchedulingThroughput ÷ the raw binding-write rate, at least.
pub const FLOOR_RATIO_TARGET: f64 = 0.70;
/// The scheduler process's RSS with case 1's nodes and pods, at most.
pub const RSS_TARGET_MIB: f64 = 150.0;

/// The raw floor: pods created, then bound straight from the bench.
pub struct Floor {
    pub pods: usize,
    pub create: Latencies,
    pub create_wall: Duration,
    pub bind: Latencies,
    pub bind_wall: Duration,
}

impl Floor {
    pub fn bind_rate(&self) -> f64 {
        self.pods as f64 / self.bind_wall.as_secs_f64()
    }

    fn create_rate(&self) -> f64 {
        self.pods as f64 / self.create_wall.as_secs_f64()
    }

    /// Pods per second when each is created and then bound, the server doing nothing else: what
    /// a scheduler that cost nothing could reach end to end when the server is the limit.
    fn create_and_bind_rate(&self) -> f64 {
        self.pods as f64 / (self.create_wall + self.bind_wall).as_secs_f64()
    }
}

/// One scheduled run.
pub struct RunResult {
    pub case: u8,
    pub setup: Setup,
    pub arrival: Arrival,
    pub nodes: usize,
    pub pods: usize,
    /// scheduler_perf's per-interval throughputs.
    pub throughputs: Vec<f64>,
    pub samples: Vec<Sample>,
    /// From the run's origin (first create sent, or the scheduler's start for a backlog).
    pub first_bind: Duration,
    /// First bind seen → last bind seen.
    pub bind_window: Duration,
    /// Origin → all pods bound.
    pub wall: Duration,
    /// First create sent → last create answered, when created while scheduling.
    pub create_wall: Option<Duration>,
    /// The create calls.
    pub creates: Latencies,
    /// Create sent → bound seen, when created while scheduling.
    pub latency: Option<Latencies>,
    /// The scheduler's process (or the server it runs in) after the run.
    pub memory: ProcMemory,
    pub scheduler_cpu: Option<Duration>,
    pub server_cpu: Duration,
    /// The bench's own: creating, watching, sampling.
    pub bench_cpu: Duration,
    /// Mean decision time per placed pod, from the in-process scheduler's metrics.
    pub attempt_mean_ms: Option<f64>,
    /// Placements checked, all fine.
    pub checked: usize,
}

impl RunResult {
    pub fn label(&self) -> String {
        let setup = match self.setup {
            Setup::Process => "scheduler process",
            Setup::InProcess => "in berth server",
        };
        let arrival = match self.arrival {
            Arrival::WhileScheduling => "created while scheduling",
            Arrival::Backlog => "backlog, created first",
        };
        format!("case {}, {setup}, {arrival}", self.case)
    }

    pub fn average(&self) -> Option<f64> {
        average(&self.throughputs)
    }

    fn bind_window_rate(&self) -> Option<f64> {
        let secs = self.bind_window.as_secs_f64();
        (secs > 0.0).then(|| (self.pods - 1) as f64 / secs)
    }

    fn wall_rate(&self) -> f64 {
        self.pods as f64 / self.wall.as_secs_f64()
    }

    fn create_rate(&self) -> Option<f64> {
        self.create_wall.map(|w| self.pods as f64 / w.as_secs_f64())
    }

    /// SchedulingThroughput, or the first→last bind rate when the run was too short for a sample.
    fn headline(&self) -> (Option<f64>, &'static str) {
        match self.average() {
            Some(v) => (Some(v), "SchedulingThroughput"),
            None => (self.bind_window_rate(), "first→last bind rate (too short for a sample)"),
        }
    }

    fn memory_of(&self) -> &'static str {
        match self.setup {
            Setup::Process => "berth scheduler",
            Setup::InProcess => "berth server (API + store + scheduler)",
        }
    }

    fn per_pod_ms(&self, cpu: Option<Duration>) -> Option<f64> {
        cpu.map(|c| c.as_secs_f64() * 1000.0 / self.pods as f64)
    }

    /// One line for the progress output.
    pub fn summary(&self) -> String {
        format!(
            "{}: SchedulingThroughput {} pods/s ({} samples), all bound in {:.2} s, {} RSS {:.1} MiB",
            self.label(),
            cell(self.average(), 0),
            self.throughputs.len(),
            self.wall.as_secs_f64(),
            self.memory_of(),
            mib(self.memory.rss)
        )
    }
}

pub struct Report {
    pub nodes: usize,
    pub pods: usize,
    pub case2_nodes: usize,
    pub case2_pods: usize,
    pub group_size: usize,
    pub clients: usize,
    pub binds_in_flight: usize,
    pub sample_interval: Duration,
    pub floor: Floor,
    pub runs: Vec<RunResult>,
}

fn cell(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.decimals$}"))
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "not measured",
    }
}

fn percentiles(l: &Latencies) -> Figure {
    Figure::new("", "", l, None)
}

impl Report {
    fn find(&self, case: u8, setup: Setup, arrival: Arrival) -> Option<&RunResult> {
        self.runs.iter().find(|r| r.case == case && r.setup == setup && r.arrival == arrival)
    }

    /// Case 1 with the scheduler as a process of its own and pods created while it schedules.
    fn case1(&self) -> Option<&RunResult> {
        self.find(1, Setup::Process, Arrival::WhileScheduling)
    }

    fn case2(&self) -> Option<&RunResult> {
        self.find(2, Setup::Process, Arrival::WhileScheduling)
    }

    fn case2_ratio(&self) -> Option<f64> {
        let (c1, c2) = (self.case1()?.headline().0?, self.case2()?.headline().0?);
        Some(c2 / c1)
    }

    pub fn print(&self) {
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        println!();
        let case2 = match self.case2() {
            Some(_) => format!(
                ", case 2 {} nodes / {} pods in groups of {}",
                self.case2_nodes, self.case2_pods, self.group_size
            ),
            None => String::new(),
        };
        println!(
            "berth-bench scheduler: case 1 {} nodes / {} pods{case2}; {} creating clients; {cpus} CPUs",
            self.nodes, self.pods, self.clients
        );
        println!(
            "nodes: allocatable cpu 32, memory 128Gi, pods 110; runtimeHandlers [runc,crun,runsc] / [runc,crun] / [runc] by thirds;"
        );
        println!(
            "       10 zones; 5 % tainted NoSchedule. pods: requests 100m / 128Mi, RuntimeClass runc / crun / gvisor (runsc)"
        );
        if self.case2().is_some() {
            println!(
                "case 2: groups alternate required podAntiAffinity on kubernetes.io/hostname and topologySpreadConstraints"
            );
            println!("        (zone, maxSkew 1, DoNotSchedule); each group owned by one fake ReplicaSet");
        }
        println!(
            "SchedulingThroughput: bound pods (spec.nodeName seen on the bench's watch) sampled every {:.1} s, averaged as",
            self.sample_interval.as_secs_f64()
        );
        println!("        scheduler_perf does (first sample and the last partial interval left out)");
        println!();
        let f = &self.floor;
        let (c, b) = (percentiles(&f.create), percentiles(&f.bind));
        println!("floor (same server, no scheduler running), {} pods:", f.pods);
        println!(
            "  create, {:>2} clients          {:>7.0} pods/s   p50 {:>6} ms  p99 {:>6} ms",
            self.clients,
            f.create_rate(),
            cell(c.p50_ms, 2),
            cell(c.p99_ms, 2)
        );
        println!(
            "  pods/binding, {:>2} in flight   {:>7.0} binds/s  p50 {:>6} ms  p99 {:>6} ms   (raw binding-write rate)",
            self.binds_in_flight,
            f.bind_rate(),
            cell(b.p50_ms, 2),
            cell(b.p99_ms, 2)
        );
        println!(
            "  create, then bind             {:>7.0} pods/s   (both walls added: the end-to-end ceiling of a free scheduler)",
            f.create_and_bind_rate()
        );
        println!();
        println!(
            "{:<51} {:>6} {:>9} {:>7} {:>9} {:>9} {:>9} {:>10}",
            "run (pods/s)", "pods", "sched.thr", "samples", "min", "max", "1st→last", "create→all"
        );
        println!("{}", "-".repeat(118));
        for r in &self.runs {
            let min = r.throughputs.iter().copied().reduce(f64::min);
            let max = r.throughputs.iter().copied().reduce(f64::max);
            println!(
                "{:<51} {:>6} {:>9} {:>7} {:>9} {:>9} {:>9} {:>10.0}",
                r.label(),
                r.pods,
                cell(r.average(), 0),
                r.throughputs.len(),
                cell(min, 0),
                cell(max, 0),
                cell(r.bind_window_rate(), 0),
                r.wall_rate(),
            );
        }
        println!(
            "(1st→last: bound pods ÷ first-to-last bind; create→all: pods ÷ first create (or scheduler start) to all bound)"
        );
        println!();
        println!(
            "{:<51} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9}",
            "run", "creates/s", "c→b p50", "c→b p99", "1st bind", "sched CPU", "srv CPU", "decision", "placed ok"
        );
        println!(
            "{:<51} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9}",
            "", "", "ms", "ms", "s", "ms/pod", "ms/pod", "ms/pod"
        );
        println!("{}", "-".repeat(128));
        for r in &self.runs {
            let lat = r.latency.as_ref().map(percentiles);
            println!(
                "{:<51} {:>9} {:>8} {:>8} {:>8.2} {:>9} {:>9} {:>9} {:>9} {:>9}",
                r.label(),
                cell(r.create_rate(), 0),
                cell(lat.as_ref().and_then(|l| l.p50_ms), 0),
                cell(lat.as_ref().and_then(|l| l.p99_ms), 0),
                r.first_bind.as_secs_f64(),
                cell(r.per_pod_ms(r.scheduler_cpu), 3),
                cell(r.per_pod_ms(Some(r.server_cpu)), 3),
                cell(r.per_pod_ms(Some(r.bench_cpu)), 3),
                cell(r.attempt_mean_ms, 3),
                r.checked,
            );
        }
        println!(
            "(c→b: create sent → bound seen; CPU: user+system over the run; decision: mean scheduling attempt, in-process metrics)"
        );
        println!();
        println!("memory after each run (+{} s idle):", super::SETTLE.as_secs());
        for r in &self.runs {
            println!(
                "  {:<51} {:<38} VmRSS {:>6.1} MiB  VmHWM {:>6.1} MiB",
                r.label(),
                r.memory_of(),
                mib(r.memory.rss),
                mib(r.memory.peak)
            );
        }
        println!();
        let floor = self.floor.bind_rate();
        for r in &self.runs {
            if r.case == 1 {
                let (v, what) = r.headline();
                println!("{}: {what} ÷ raw binds/s = {}", r.label(), cell(v.map(|v| v / floor), 2));
            }
        }
        if let Some(c1) = self.case1() {
            let (v, what) = c1.headline();
            println!();
            println!(
                "case 1 {what}: {} pods/s, target ≥ {THROUGHPUT_TARGET:.0}: {}",
                cell(v, 0),
                verdict(v.map(|v| v >= THROUGHPUT_TARGET))
            );
            let ratio = v.map(|v| v / floor);
            println!(
                "case 1 ÷ raw binding-write rate ({floor:.0} binds/s): {}, target ≥ {FLOOR_RATIO_TARGET:.2}: {}",
                cell(ratio, 2),
                verdict(ratio.map(|r| r >= FLOOR_RATIO_TARGET))
            );
            let (rss, hwm) = (mib(c1.memory.rss), mib(c1.memory.peak));
            println!(
                "scheduler RSS at {} nodes / {} pods: {rss:.1} MiB (peak {hwm:.1} MiB), target ≤ {RSS_TARGET_MIB:.0} MiB: {}",
                c1.nodes,
                c1.pods,
                verdict(Some(hwm <= RSS_TARGET_MIB))
            );
        }
        if let Some(c2) = self.case2() {
            let (v, what) = c2.headline();
            println!(
                "case 2 {what}: {} pods/s, {} × case 1; scheduler RSS {:.1} MiB (peak {:.1} MiB)",
                cell(v, 0),
                cell(self.case2_ratio(), 2),
                mib(c2.memory.rss),
                mib(c2.memory.peak)
            );
        }
    }

    pub fn to_json(&self) -> Value {
        let floor = self.floor.bind_rate();
        let latency_json = |l: &Latencies| {
            let f = percentiles(l);
            json!({"p50_ms": f.p50_ms, "p99_ms": f.p99_ms, "samples": f.samples})
        };
        let runs: Vec<Value> = self
            .runs
            .iter()
            .map(|r| {
                json!({
                    "label": r.label(),
                    "case": r.case,
                    "setup": match r.setup { Setup::Process => "process", Setup::InProcess => "in_process" },
                    "arrival": match r.arrival { Arrival::WhileScheduling => "while_scheduling", Arrival::Backlog => "backlog" },
                    "nodes": r.nodes,
                    "pods": r.pods,
                    "scheduling_throughput_avg": r.average(),
                    "scheduling_throughputs": r.throughputs,
                    "bound_samples": r.samples.iter().map(|s| json!([s.at.as_secs_f64(), s.bound])).collect::<Vec<_>>(),
                    "first_to_last_bind_per_sec": r.bind_window_rate(),
                    "all_bound_per_sec": r.wall_rate(),
                    "wall_s": r.wall.as_secs_f64(),
                    "first_bind_s": r.first_bind.as_secs_f64(),
                    "creates_per_sec": r.create_rate(),
                    "create_call": latency_json(&r.creates),
                    "create_to_bound": r.latency.as_ref().map(latency_json),
                    "vs_raw_binds": r.headline().0.map(|v| v / floor),
                    "memory_of": r.memory_of(),
                    "vm_rss_kib": r.memory.rss,
                    "vm_hwm_kib": r.memory.peak,
                    "rss_anon_kib": r.memory.anon,
                    "scheduler_cpu_ms_per_pod": r.per_pod_ms(r.scheduler_cpu),
                    "server_cpu_ms_per_pod": r.per_pod_ms(Some(r.server_cpu)),
                    "bench_cpu_ms_per_pod": r.per_pod_ms(Some(r.bench_cpu)),
                    "mean_attempt_ms": r.attempt_mean_ms,
                    "placements_checked": r.checked,
                })
            })
            .collect();
        let case1 = self.case1().map(|c1| {
            let v = c1.headline().0;
            json!({
                "pods_per_sec": v,
                "throughput_target": THROUGHPUT_TARGET,
                "vs_raw_binds": v.map(|v| v / floor),
                "vs_raw_binds_target": FLOOR_RATIO_TARGET,
                "scheduler_vm_rss_mib": mib(c1.memory.rss),
                "scheduler_vm_hwm_mib": mib(c1.memory.peak),
                "rss_target_mib": RSS_TARGET_MIB,
            })
        });
        json!({
            "nodes": self.nodes,
            "pods": self.pods,
            "case2_nodes": self.case2_nodes,
            "case2_pods": self.case2_pods,
            "group_size": self.group_size,
            "clients": self.clients,
            "binds_in_flight": self.binds_in_flight,
            "sample_interval_s": self.sample_interval.as_secs_f64(),
            "floor": {
                "pods": self.floor.pods,
                "creates_per_sec": self.floor.create_rate(),
                "create": latency_json(&self.floor.create),
                "binds_per_sec": floor,
                "create_then_bind_per_sec": self.floor.create_and_bind_rate(),
                "bind": latency_json(&self.floor.bind),
            },
            "runs": runs,
            "case1": case1,
            "case2_vs_case1": self.case2_ratio(),
        })
    }
}
