//! The printed table of `berth-bench agent`: pod start next to CRI only and the floor, the
//! agent's overhead and memory against the targets of issue #5, and the JSON.

use std::time::Duration;

use serde_json::{Value, json};

use super::cluster::ProcMemory;
use crate::stats::{Figure, Latencies};

/// Pod start p50 minus CRI-only p50, at most.
pub const OVERHEAD_TARGET_MS: f64 = 10.0;
/// The agent's RSS with the pods running, at most.
pub const AGENT_RSS_TARGET_MIB: f64 = 20.0;

/// Everything measured under one handler.
pub struct HandlerResult {
    pub handler: String,
    pub pods: usize,
    /// API create → the watch sees the pod Running, of pods whose container started at once.
    pub start: Latencies,
    /// The create call alone.
    pub create: Latencies,
    /// RunPodSandbox + CreateContainer + StartContainer straight against the runtime.
    pub cri: Latencies,
    /// Per iteration with a clean start: pod start minus the CRI-only pod measured next to
    /// it, in ms (paired, so slow drifts of the machine's load cancel).
    pub paired_ms: Vec<f64>,
    pub floor_run: Latencies,
    pub floor_cni: Latencies,
    pub floor_total: Latencies,
    /// The agent's memory, idle with the handler's pods running.
    pub memory: Option<ProcMemory>,
    /// The agent's memory, idle again once the handler's pods are deleted.
    pub memory_after_delete: Option<ProcMemory>,
    /// CPU time of the agent and of the server over the measured pods (floor and CRI-only
    /// samples included, which neither takes part in).
    pub agent_cpu: Option<Duration>,
    pub server_cpu: Option<Duration>,
    /// Wall time of the measured loop.
    pub wall: Duration,
    /// Measured pods created through the API (and in the agent's hands when its memory is read).
    pub pods_created: usize,
    /// Pods whose first start failed: why (the runtime's message).
    pub failed: Vec<String>,
}

impl HandlerResult {
    pub fn new(handler: &str, pods: usize) -> Self {
        Self {
            handler: handler.to_owned(),
            pods,
            start: Latencies::default(),
            create: Latencies::default(),
            cri: Latencies::default(),
            paired_ms: Vec::new(),
            floor_run: Latencies::default(),
            floor_cni: Latencies::default(),
            floor_total: Latencies::default(),
            memory: None,
            memory_after_delete: None,
            agent_cpu: None,
            server_cpu: None,
            wall: Duration::ZERO,
            pods_created: 0,
            failed: Vec::new(),
        }
    }

    fn runtime(&self) -> &str {
        if self.handler == "gvisor" { "runsc" } else { &self.handler }
    }

    fn rows(&self) -> Vec<(String, &Latencies)> {
        vec![
            ("pod start: create → Running seen".into(), &self.start),
            ("  of which the create call".into(), &self.create),
            ("CRI only: RunPodSandbox+Create+Start".into(), &self.cri),
            (format!("floor: {} run + CNI ADD+DEL", self.runtime()), &self.floor_total),
            (format!("  of which {} run", self.runtime()), &self.floor_run),
            ("  of which CNI ADD+DEL".into(), &self.floor_cni),
        ]
    }

    /// Pod start minus CRI only, at p50 and at p99.
    fn overhead_ms(&self) -> (Option<f64>, Option<f64>) {
        let (start, cri) = (fig(&self.start), fig(&self.cri));
        let minus = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a - b);
        (minus(start.p50_ms, cri.p50_ms), minus(start.p99_ms, cri.p99_ms))
    }

    /// The median of the paired differences.
    fn paired_median_ms(&self) -> Option<f64> {
        let mut v = self.paired_ms.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        (n > 0).then(|| if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
    }

    fn per_pod_ms(&self, cpu: Option<Duration>) -> Option<f64> {
        cpu.map(|c| c.as_secs_f64() * 1000.0 / self.pods_created.max(1) as f64)
    }
}

pub struct Report {
    pub pods: usize,
    pub warmup: usize,
    pub settle: u64,
    pub image: String,
    /// The pods' CPU request; none: BestEffort.
    pub cpu_request: Option<String>,
    pub runtime_version: String,
    /// The Node's `containerRuntimeVersion`, as the agent reports it.
    pub node_runtime_version: String,
    /// The agent's memory after it registered the node, before any pod.
    pub idle_memory: ProcMemory,
    pub handlers: Vec<HandlerResult>,
}

fn fig(l: &Latencies) -> Figure {
    Figure::new("", "", l, None)
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
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

fn memory_json(m: &ProcMemory) -> Value {
    json!({"vm_rss": m.rss, "rss_anon": m.anon, "rss_file": m.file, "vm_rss_max": m.rss_max, "vm_hwm": m.peak})
}

impl Report {
    pub fn print(&self) {
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        let counts: Vec<String> = self.handlers.iter().map(|h| format!("{} {}", h.handler, h.pods)).collect();
        println!();
        println!(
            "berth-bench agent: pods per handler ({}), one after another, all kept running; {} warm-up each; {cpus} CPUs",
            counts.join(", "),
            self.warmup
        );
        let qos = match &self.cpu_request {
            Some(cpu) => format!("Burstable, requests cpu {cpu}"),
            None => "BestEffort: pod cgroup cpu.shares 2".into(),
        };
        println!(
            "pod start: API create → the bench's watch sees phase Running with the container running; busybox `sleep 3600`"
        );
        println!(
            "           ({}, imagePullPolicy IfNotPresent, present; {qos}), nodeName and runtimeClassName set, through berth server,",
            self.image
        );
        println!(
            "           berth agent (node runtimes: {}) and berth runtime ({})",
            self.node_runtime_version, self.runtime_version
        );
        println!(
            "CRI only:  RunPodSandbox + CreateContainer + StartContainer of the same image and command, straight to the runtime"
        );
        println!(
            "floor:     raw `runc run` / `crun run` / `runsc --platform=ptrace --network=none run` of a busybox /bin/true"
        );
        println!("           bundle, then one CNI ADD+DEL executing only the plugins");
        println!();
        println!("{:<7} {:<38} {:>9} {:>9} {:>7}", "handler", "metric (ms)", "p50", "p99", "samples");
        println!("{}", "-".repeat(74));
        for h in &self.handlers {
            for (metric, l) in h.rows() {
                let f = fig(l);
                println!("{:<7} {metric:<38} {:>9} {:>9} {:>7}", h.handler, ms(f.p50_ms), ms(f.p99_ms), f.samples);
            }
        }
        println!();
        println!("agent overhead = pod start − CRI only (p50; p99 in brackets; then the median of each pod's start");
        println!("minus the CRI-only pod measured next to it):");
        for h in &self.handlers {
            let (p50, p99) = h.overhead_ms();
            println!(
                "  {:<7} {:>7} ms [{} ms]  (target ≤ {OVERHEAD_TARGET_MS} ms at p50: {});  paired {} ms",
                h.handler,
                ms(p50),
                ms(p99),
                verdict(p50.map(|v| v <= OVERHEAD_TARGET_MS)),
                ms(h.paired_median_ms()),
            );
        }
        println!();
        println!("agent memory: the median of readings every 100 ms over the last 6 s of each idle period");
        println!("(max RSS: the highest of them; VmHWM: the peak since the agent started)");
        println!(
            "{:<40} {:>9} {:>8} {:>9} {:>9} {:>9} {:>9}  target",
            "berth agent memory (KiB)", "VmRSS", "MiB", "RssAnon", "RssFile", "max RSS", "VmHWM"
        );
        println!("{}", "-".repeat(116));
        let row = |what: String, m: &ProcMemory, target: bool| {
            let t = if target {
                format!("≤ {AGENT_RSS_TARGET_MIB} MiB: {}", verdict(Some(mib(m.rss) <= AGENT_RSS_TARGET_MIB)))
            } else {
                String::new()
            };
            println!(
                "{what:<40} {:>9} {:>8.1} {:>9} {:>9} {:>9} {:>9}  {t}",
                m.rss,
                mib(m.rss),
                m.anon,
                m.file,
                m.rss_max,
                m.peak
            );
        };
        row("node registered, no pods".into(), &self.idle_memory, false);
        for h in &self.handlers {
            if let Some(m) = &h.memory {
                row(format!("{}: {} pods on the node, idle {} s", h.handler, h.pods_created, self.settle), m, true);
            }
            if let Some(m) = &h.memory_after_delete {
                row(format!("{}: pods deleted, idle {} s", h.handler, self.settle), m, false);
            }
        }
        let failing: Vec<&HandlerResult> = self.handlers.iter().filter(|h| !h.failed.is_empty()).collect();
        if !failing.is_empty() {
            println!();
            println!("failed first starts (not in the pod start row; the agent retries them after its back-off):");
            for h in failing {
                println!("  {:<7} {} of {} pods, e.g. {}", h.handler, h.failed.len(), h.pods_created, h.failed[0]);
            }
        }
        println!();
        println!("CPU per measured pod (user+sys over the loop ÷ pods; floor and CRI-only samples in the same loop):");
        for h in &self.handlers {
            println!(
                "  {:<7} agent {:>6} ms, server {:>6} ms; loop {:.1} s",
                h.handler,
                ms(h.per_pod_ms(h.agent_cpu)),
                ms(h.per_pod_ms(h.server_cpu)),
                h.wall.as_secs_f64()
            );
        }
    }

    pub fn to_json(&self) -> Value {
        let f = |l: &Latencies| {
            let f = fig(l);
            json!({"p50_ms": f.p50_ms, "p99_ms": f.p99_ms, "samples": f.samples})
        };
        let handlers: Vec<Value> = self
            .handlers
            .iter()
            .map(|h| {
                let (p50, p99) = h.overhead_ms();
                json!({
                    "handler": h.handler,
                    "pods": h.pods,
                    "pod_start": f(&h.start),
                    "api_create": f(&h.create),
                    "cri_only": f(&h.cri),
                    "floor": {"runtime_run": f(&h.floor_run), "cni_add_del": f(&h.floor_cni), "total": f(&h.floor_total)},
                    "agent_overhead_ms": {"p50": p50, "p99": p99, "paired_median": h.paired_median_ms(), "target_max_p50": OVERHEAD_TARGET_MS},
                    "agent_memory_kib": h.memory.as_ref().map(memory_json),
                    "agent_memory_after_delete_kib": h.memory_after_delete.as_ref().map(memory_json),
                    "agent_rss_target_mib": AGENT_RSS_TARGET_MIB,
                    "cpu_per_pod_ms": {"agent": h.per_pod_ms(h.agent_cpu), "server": h.per_pod_ms(h.server_cpu)},
                    "loop_seconds": h.wall.as_secs_f64(),
                    "pods_created": h.pods_created,
                    "failed_first_starts": h.failed,
                })
            })
            .collect();
        json!({
            "pods": self.pods,
            "warmup": self.warmup,
            "settle_seconds": self.settle,
            "image": self.image,
            "cpu_request": self.cpu_request,
            "runtime": self.runtime_version,
            "node_container_runtime_version": self.node_runtime_version,
            "agent_idle_memory_kib": memory_json(&self.idle_memory),
            "handlers": handlers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overhead_is_pod_start_minus_cri_only_at_each_quantile() {
        let mut h = HandlerResult::new("runc", 3);
        for ms in [100, 110, 120] {
            h.start.record(Duration::from_millis(ms));
        }
        for ms in [90, 95, 100] {
            h.cri.record(Duration::from_millis(ms));
        }
        h.paired_ms = vec![10.0, 15.0, 20.0, 30.0];
        assert_eq!(h.paired_median_ms(), Some(17.5));
        let (p50, p99) = h.overhead_ms();
        assert!((p50.unwrap() - 15.0).abs() < 0.2, "{p50:?}");
        assert!((p99.unwrap() - 20.0).abs() < 0.2, "{p99:?}");
        assert_eq!(HandlerResult::new("crun", 1).overhead_ms(), (None, None));
    }
}
