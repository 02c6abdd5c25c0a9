//! The printed table of `berth-bench cri`, its headline ratios and memory figures, and the JSON.

use serde_json::{Value, json};

use crate::stats::{Figure, Latencies};

/// berth's whole pod lifecycle ÷ the floor's (raw OCI runtime run + CNI ADD+DEL), at most.
pub const FLOOR_RATIO_TARGET: f64 = 1.3;
/// containerd's whole pod lifecycle ÷ berth's, at least.
pub const CONTAINERD_RATIO_TARGET: f64 = 3.0;
/// `berth runtime` idle RSS, at most.
pub const RUNTIME_RSS_TARGET_MIB: f64 = 15.0;
/// One container's `berth-monitor` RSS, at most.
pub const MONITOR_RSS_TARGET_MIB: f64 = 2.0;

/// Per-phase latencies of one runtime under one handler.
#[derive(Default)]
pub struct Phases {
    pub run_pod: Latencies,
    pub create_start: Latencies,
    pub wait_exit: Latencies,
    pub stop_remove_container: Latencies,
    pub stop_container: Latencies,
    pub stop_remove_pod: Latencies,
    pub lifecycle: Latencies,
}

/// The floor of one handler: the raw runtime's `run`, CNI ADD+DEL, and the two added per sample.
#[derive(Default)]
pub struct FloorFigures {
    pub run: Latencies,
    pub cni: Latencies,
    pub total: Latencies,
}

/// One printed row: metric, then the floor's, berth's and containerd's latencies where measured.
type Row<'a> = (String, Option<&'a Latencies>, Option<&'a Latencies>, Option<&'a Latencies>);

pub struct HandlerResult {
    pub handler: String,
    pub pods: usize,
    pub floor: FloorFigures,
    pub berth: Phases,
    pub containerd: Phases,
}

impl HandlerResult {
    pub fn new(handler: &str, pods: usize) -> Self {
        Self {
            handler: handler.to_owned(),
            pods,
            floor: FloorFigures::default(),
            berth: Phases::default(),
            containerd: Phases::default(),
        }
    }

    fn rows(&self) -> Vec<Row<'_>> {
        let (b, c) = (&self.berth, &self.containerd);
        let runtime = if self.handler == "gvisor" { "runsc" } else { self.handler.as_str() };
        vec![
            ("RunPodSandbox".into(), None, Some(&b.run_pod), Some(&c.run_pod)),
            ("Create+StartContainer".into(), None, Some(&b.create_start), Some(&c.create_start)),
            ("start → exit seen".into(), None, Some(&b.wait_exit), Some(&c.wait_exit)),
            ("Stop+RemoveContainer".into(), None, Some(&b.stop_remove_container), Some(&c.stop_remove_container)),
            ("  of which Stop".into(), None, Some(&b.stop_container), Some(&c.stop_container)),
            ("Stop+RemovePodSandbox".into(), None, Some(&b.stop_remove_pod), Some(&c.stop_remove_pod)),
            (format!("{runtime} run (floor)"), Some(&self.floor.run), None, None),
            ("CNI ADD+DEL (floor)".into(), Some(&self.floor.cni), None, None),
            ("whole lifecycle".into(), Some(&self.floor.total), Some(&b.lifecycle), Some(&c.lifecycle)),
        ]
    }

    fn lifecycle(&self) -> [Figure; 3] {
        [
            Figure::new("floor", "lifecycle", &self.floor.total, None),
            Figure::new("berth", "lifecycle", &self.berth.lifecycle, None),
            Figure::new("containerd", "lifecycle", &self.containerd.lifecycle, None),
        ]
    }

    /// (berth ÷ floor, containerd ÷ berth) of the lifecycle at p50 and at p99.
    fn ratios(&self) -> [(Option<f64>, Option<f64>); 2] {
        let [floor, berth, containerd] = self.lifecycle();
        let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
        [
            (ratio(berth.p50_ms, floor.p50_ms), ratio(containerd.p50_ms, berth.p50_ms)),
            (ratio(berth.p99_ms, floor.p99_ms), ratio(containerd.p99_ms, berth.p99_ms)),
        ]
    }
}

/// Resident memory in KiB; `None` where it could not be read (the reason went to stderr).
#[derive(Default)]
pub struct Memory {
    pub berth_idle_kib: Option<u64>,
    pub berth_busy_kib: Option<u64>,
    pub monitor_kib: Option<u64>,
    pub infra_kib: Option<u64>,
    pub containerd_idle_kib: Option<u64>,
    pub containerd_busy_kib: Option<u64>,
    pub shim_kib: Option<u64>,
    pub shim_name: String,
}

pub struct Report {
    pub pods: usize,
    pub gvisor_pods: usize,
    pub gvisor_measured: bool,
    pub warmup: usize,
    pub image: String,
    pub berth_version: String,
    pub containerd_version: String,
    pub floor_plugins: Vec<String>,
    pub handlers: Vec<HandlerResult>,
    pub memory: Memory,
}

fn ms(l: Option<&Latencies>, q: fn(&Figure) -> Option<f64>) -> String {
    l.and_then(|l| q(&Figure::new("", "", l, None))).map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

fn times(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}×"))
}

fn mib(kib: Option<u64>) -> Option<f64> {
    kib.map(|k| k as f64 / 1024.0)
}

fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "not measured",
    }
}

impl Report {
    pub fn print(&self) {
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        println!();
        println!(
            "berth-bench cri: {} pods per handler and runtime{}, {} warm-up pods each, one after another; {cpus} CPUs",
            self.pods,
            if self.gvisor_measured && self.gvisor_pods < self.pods {
                format!(" (gvisor: {}, --gvisor-pods)", self.gvisor_pods)
            } else {
                String::new()
            },
            self.warmup,
        );
        println!(
            "pod: RunPodSandbox, Create+Start of `true` ({}), ContainerStatus polled every {} ms until",
            self.image,
            super::client::EXIT_POLL.as_millis()
        );
        println!(
            "     EXITED, Stop+RemoveContainer, Stop+RemovePodSandbox; runtimes: {}; {}",
            self.berth_version, self.containerd_version
        );
        println!(
            "floor: raw `runc run` / `crun run` / `runsc --platform=ptrace --network=none run` of a busybox /bin/true bundle,"
        );
        println!("       then one CNI ADD+DEL executing only the plugins ({})", self.floor_plugins.join(", "));
        println!();
        println!(
            "{:<7} {:<22} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>6}",
            "handler",
            "metric (ms)",
            "floor p50",
            "floor p99",
            "berth p50",
            "berth p99",
            "ctrd p50",
            "ctrd p99",
            "pods"
        );
        println!("{}", "-".repeat(103));
        for h in &self.handlers {
            for (metric, floor, berth, ctrd) in h.rows() {
                println!(
                    "{:<7} {:<22} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>6}",
                    h.handler,
                    metric,
                    ms(floor, |f| f.p50_ms),
                    ms(floor, |f| f.p99_ms),
                    ms(berth, |f| f.p50_ms),
                    ms(berth, |f| f.p99_ms),
                    ms(ctrd, |f| f.p50_ms),
                    ms(ctrd, |f| f.p99_ms),
                    h.pods
                );
            }
        }
        println!();
        println!("whole lifecycle ratios (p50; p99 in brackets):");
        for h in &self.handlers {
            let [(floor50, ctrd50), (floor99, ctrd99)] = h.ratios();
            println!(
                "  {:<7} berth ÷ floor {:>7} [{}] (target ≤ {FLOOR_RATIO_TARGET}×: {});  containerd ÷ berth {:>7} [{}] (target ≥ {CONTAINERD_RATIO_TARGET}×: {})",
                h.handler,
                times(floor50),
                times(floor99),
                verdict(floor50.map(|r| r <= FLOOR_RATIO_TARGET)),
                times(ctrd50),
                times(ctrd99),
                verdict(ctrd50.map(|r| r >= CONTAINERD_RATIO_TARGET)),
            );
        }
        let m = &self.memory;
        let shim = if m.shim_name.is_empty() { "containerd shim" } else { m.shim_name.as_str() };
        let rows: [(String, Option<u64>, Option<f64>); 7] = [
            ("berth runtime, idle after the runs".into(), m.berth_idle_kib, Some(RUNTIME_RSS_TARGET_MIB)),
            ("berth runtime, one pod running".into(), m.berth_busy_kib, None),
            ("berth-monitor of one running container".into(), m.monitor_kib, Some(MONITOR_RSS_TARGET_MIB)),
            ("berth-monitor pause (the pod's infra)".into(), m.infra_kib, None),
            ("containerd, idle after the runs".into(), m.containerd_idle_kib, None),
            ("containerd, one pod running".into(), m.containerd_busy_kib, None),
            (format!("{shim} of that pod"), m.shim_kib, None),
        ];
        println!();
        println!("{:<42} {:>9} {:>8}  target", "memory (VmRSS; pods under runc)", "KiB", "MiB");
        println!("{}", "-".repeat(78));
        for (what, kib, target) in rows {
            let target =
                target.map_or_else(String::new, |t| format!("≤ {t} MiB: {}", verdict(mib(kib).map(|v| v <= t))));
            let kib_text = kib.map_or_else(|| "-".to_owned(), |k| k.to_string());
            let mib_text = mib(kib).map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
            println!("{what:<42} {kib_text:>9} {mib_text:>8}  {target}");
        }
        println!();
        println!(
            "berth per pod: one berth-monitor per container + the infra berth-monitor; containerd per pod: one shim + pause"
        );
    }

    pub fn to_json(&self) -> Value {
        let phases = |p: &Phases| {
            let f = |name: &str, l: &Latencies| {
                let f = Figure::new("", name, l, None);
                json!({"p50_ms": f.p50_ms, "p99_ms": f.p99_ms, "samples": f.samples})
            };
            json!({
                "run_pod_sandbox": f("run", &p.run_pod),
                "create_start_container": f("create", &p.create_start),
                "start_to_exit_seen": f("wait", &p.wait_exit),
                "stop_remove_container": f("stop", &p.stop_remove_container),
                "stop_container": f("stop alone", &p.stop_container),
                "stop_remove_pod_sandbox": f("stop pod", &p.stop_remove_pod),
                "lifecycle": f("lifecycle", &p.lifecycle),
            })
        };
        let handlers: Vec<Value> = self
            .handlers
            .iter()
            .map(|h| {
                let [(f50, c50), (f99, c99)] = h.ratios();
                let fig = |l: &Latencies| {
                    let f = Figure::new("", "", l, None);
                    json!({"p50_ms": f.p50_ms, "p99_ms": f.p99_ms, "samples": f.samples})
                };
                json!({
                    "handler": h.handler,
                    "pods": h.pods,
                    "floor": {"runtime_run": fig(&h.floor.run), "cni_add_del": fig(&h.floor.cni), "lifecycle": fig(&h.floor.total)},
                    "berth": phases(&h.berth),
                    "containerd": phases(&h.containerd),
                    "berth_vs_floor": {"p50": f50, "p99": f99, "target_max": FLOOR_RATIO_TARGET},
                    "containerd_vs_berth": {"p50": c50, "p99": c99, "target_min": CONTAINERD_RATIO_TARGET},
                })
            })
            .collect();
        let m = &self.memory;
        json!({
            "pods": self.pods,
            "gvisor_pods": self.gvisor_pods,
            "warmup": self.warmup,
            "image": self.image,
            "berth": self.berth_version,
            "containerd": self.containerd_version,
            "floor_cni_plugins": self.floor_plugins,
            "handlers": handlers,
            "memory_kib": {
                "berth_runtime_idle": m.berth_idle_kib, "berth_runtime_one_pod": m.berth_busy_kib,
                "berth_monitor": m.monitor_kib, "berth_infra": m.infra_kib,
                "containerd_idle": m.containerd_idle_kib, "containerd_one_pod": m.containerd_busy_kib,
                "containerd_shim": m.shim_kib,
                "targets_mib": {"berth_runtime": RUNTIME_RSS_TARGET_MIB, "berth_monitor": MONITOR_RSS_TARGET_MIB},
            },
        })
    }
}
