//! The printed tables of `berth-bench startup` — each shape of each handler next to the floor
//! and containerd, the tree's memory, and the targets — and the same figures as JSON.

use std::time::Duration;

use serde_json::{Value, json};

use super::api_pods::Start;
use super::cluster::{TreeMemory, Usage};
use crate::agent::pods::Ended;
use crate::stats::{Figure, Latencies};

/// One-at-a-time start p50 over the floor's p50, at most.
const P50_TARGET: f64 = 1.5;
/// One-at-a-time start p99 over the floor, at most.
const P99_TARGET: f64 = 2.5;
/// The runc burst: pods per second, at least, and its per-pod p99, at most.
const BURST_RATE_TARGET: f64 = 20.0;
const BURST_P99_TARGET_MS: f64 = 2000.0;
/// The tree's memory (PSS summed) idle and with the pods running, at most.
const IDLE_TARGET_MIB: f64 = 60.0;
const BUSY_TARGET_MIB: f64 = 100.0;

/// One shape's pods through berth and through containerd.
#[derive(Default)]
pub struct Shape {
    pub berth: Latencies,
    /// Starts that did not end Running (the runtime's message, or a timeout).
    pub berth_failed: Vec<String>,
    pub containerd: Latencies,
    /// A burst's pods through berth, each from its own creation to Running.
    pub berth_since_created: Latencies,
    /// The whole shape's wall time through berth, where it means something (a burst's: until
    /// all are Running).
    pub wall: Option<Duration>,
}

impl Shape {
    pub fn record_berth(&mut self, start: &Start) {
        match &start.ended {
            Ended::Running => self.berth.record(start.took),
            Ended::Failed(why) => self.berth_failed.push(why.clone()),
        }
    }
}

/// Everything measured under one handler.
pub struct HandlerResult {
    pub handler: String,
    /// `X run` of the floor's bundle.
    pub floor_run: Latencies,
    /// One CNI ADD of the cluster's plugins.
    pub floor_cni_add: Latencies,
    /// The two, sample by sample.
    pub floor: Latencies,
    pub one_at_a_time: Shape,
    pub waves: Shape,
    pub burst: Shape,
    /// Until containerd's last burst pod had started.
    pub containerd_burst_wall: Option<Duration>,
    /// The floor as a burst: as many samples, [`FloorBurst::parallel`] at a time.
    pub floor_burst: Option<FloorBurst>,
}

/// Floor samples started together, `parallel` at a time: the most starts per second the raw
/// runtime and CNI give on this machine.
pub struct FloorBurst {
    pub parallel: usize,
    /// Each sample from the burst's start to its end.
    pub done: Latencies,
    pub wall: Duration,
}

impl FloorBurst {
    pub fn rate(&self) -> f64 {
        self.done.len() as f64 / self.wall.as_secs_f64()
    }
}

impl HandlerResult {
    pub fn new(handler: &str) -> Self {
        Self {
            handler: handler.to_owned(),
            floor_run: Latencies::default(),
            floor_cni_add: Latencies::default(),
            floor: Latencies::default(),
            one_at_a_time: Shape::default(),
            waves: Shape::default(),
            burst: Shape::default(),
            containerd_burst_wall: None,
            floor_burst: None,
        }
    }

    fn runtime(&self) -> &str {
        if self.handler == "gvisor" { "runsc" } else { &self.handler }
    }

    /// One-at-a-time p50 over floor p50, and p99 over floor p99.
    fn ratios(&self) -> (Option<f64>, Option<f64>) {
        let (start, floor) = (fig(&self.one_at_a_time.berth), fig(&self.floor));
        let over = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
        (over(start.p50_ms, floor.p50_ms), over(start.p99_ms, floor.p99_ms))
    }

    fn burst_rate(&self) -> Option<f64> {
        let n = self.burst.berth.len() as usize + self.burst.berth_failed.len();
        self.burst.wall.filter(|_| self.burst.berth_failed.is_empty()).map(|w| n as f64 / w.as_secs_f64())
    }
}

pub struct Report {
    pub pods: usize,
    pub wave: usize,
    pub burst: usize,
    pub warmup: usize,
    pub image: String,
    /// From running `berth up` to its return (the node Ready).
    pub up_took: Duration,
    pub berth_version: String,
    pub containerd_version: Option<String>,
    pub floor_plugins: Vec<String>,
    pub idle_memory: TreeMemory,
    /// The handler and pod count the busy figure was read with.
    pub busy_memory: Option<(String, usize, TreeMemory)>,
    pub handlers: Vec<HandlerResult>,
}

fn fig(l: &Latencies) -> Figure {
    Figure::new("", "", l, None)
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

fn ratio(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}×"))
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

fn row(what: &str, l: &Latencies, floor: &Figure, rate: Option<f64>, failed: usize) {
    let f = fig(l);
    let over = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    println!(
        "  {what:<44} {:>8} {:>8} {:>8} {:>8} {:>7} {:>5} {:>6}",
        ms(f.p50_ms),
        ms(f.p99_ms),
        ratio(over(f.p50_ms, floor.p50_ms)),
        ratio(over(f.p99_ms, floor.p99_ms)),
        rate.map_or_else(|| "-".to_owned(), |r| format!("{r:.1}")),
        f.samples,
        failed
    );
}

impl Report {
    pub fn print(&self) {
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        println!();
        println!(
            "berth-bench startup: a `berth up` cluster (node Ready {:.1} s after `berth up` began); per handler {} pods one \
             at a time, {} in waves of {}, a Deployment of {}; {} warm-up; {cpus} CPUs",
            self.up_took.as_secs_f64(),
            self.pods,
            self.pods,
            self.wave,
            self.burst,
            self.warmup
        );
        println!(
            "berth: {}; containerd: {}",
            self.berth_version,
            self.containerd_version.as_deref().unwrap_or("not run")
        );
        println!(
            "pods: busybox `sleep 3600` ({}), BestEffort, no nodeName (through the scheduler); berth: API create → the \
             bench's watch sees Running; containerd: RunPodSandbox + CreateContainer + StartContainer returned",
            self.image
        );
        println!(
            "floor: `<runtime> run` of the same busybox rootfs running `true`, to its exit, + one CNI ADD ({})",
            self.floor_plugins.join(", ")
        );
        println!("waves and burst: each pod timed from its own create (burst: the Deployment's create)");
        for h in &self.handlers {
            let floor = fig(&h.floor);
            println!();
            println!(
                "{:<46} {:>8} {:>8} {:>8} {:>8} {:>7} {:>5} {:>6}",
                h.handler, "p50 ms", "p99 ms", "p50/fl", "p99/fl", "pods/s", "n", "failed"
            );
            row(&format!("floor: {} run + CNI ADD", h.runtime()), &h.floor, &floor, None, 0);
            row(&format!("  of which {} run", h.runtime()), &h.floor_run, &floor, None, 0);
            row("  of which CNI ADD", &h.floor_cni_add, &floor, None, 0);
            let shapes = [
                ("one at a time".to_owned(), &h.one_at_a_time, None),
                (format!("{} at a time", self.wave), &h.waves, None),
                (format!("burst of {}", self.burst), &h.burst, h.containerd_burst_wall),
            ];
            for (name, shape, ctd_wall) in shapes {
                let rate = |wall: Option<Duration>, n: u64| wall.map(|w| n as f64 / w.as_secs_f64());
                let berth_rate = if name.starts_with("burst") { h.burst_rate() } else { None };
                row(&format!("{name}: berth"), &shape.berth, &floor, berth_rate, shape.berth_failed.len());
                if self.containerd_version.is_some() {
                    let ctd_rate = rate(ctd_wall, shape.containerd.len());
                    row(&format!("{name}: containerd CRI"), &shape.containerd, &floor, ctd_rate, 0);
                }
                for why in shape.berth_failed.iter().take(3) {
                    println!("    failed: {why}");
                }
            }
            if h.burst.berth_since_created.len() > 0 {
                let what = format!("burst of {}: berth, from each pod's creation", self.burst);
                row(&what, &h.burst.berth_since_created, &floor, None, 0);
            }
            if let Some(fb) = &h.floor_burst {
                let what = format!("burst of {}: floor, {} at a time", fb.done.len(), fb.parallel);
                row(&what, &fb.done, &floor, Some(fb.rate()), 0);
            }
            if let Some(wall) = h.burst.wall {
                println!(
                    "  burst: all {} Running {:.2} s after the Deployment's create",
                    self.burst,
                    wall.as_secs_f64()
                );
            }
        }

        println!();
        println!("memory of the `berth up` tree (median of 100 ms samples over 6 s after a settle):");
        let busy = self.busy_memory.as_ref();
        let busy_title = busy.map_or_else(|| "-".to_owned(), |(h, n, _)| format!("{n} {h} pods"));
        println!("  {:<34} {:>16} {:>22}", "", "idle, 0 pods", busy_title);
        println!("  {:<34} {:>8} {:>8} {:>11} {:>10}", "MiB", "RSS", "PSS", "RSS", "PSS");
        let part_row = |name: &str, idle: Option<Usage>, busy: Option<Usage>| {
            let cell = |u: Option<Usage>, f: fn(&Usage) -> u64| {
                u.map_or_else(|| "-".to_owned(), |u| format!("{:.1}", mib(f(&u))))
            };
            println!(
                "  {name:<34} {:>8} {:>8} {:>11} {:>10}",
                cell(idle, |u| u.rss_kib),
                cell(idle, |u| u.pss_kib),
                cell(busy, |u| u.rss_kib),
                cell(busy, |u| u.pss_kib)
            );
        };
        for (name, idle) in &self.idle_memory.parts {
            let busy_part = busy.and_then(|(_, _, m)| m.parts.iter().find(|(n, _)| n == name).map(|(_, u)| *u));
            part_row(name, Some(*idle), busy_part);
        }
        part_row("whole tree", Some(self.idle_memory.total()), busy.map(|(_, _, m)| m.total()));
        if let Some((_, _, m)) = busy {
            part_row(&format!("container monitors ({})", m.monitor_count), None, Some(m.monitors));
            part_row(&format!("pod infra processes ({})", m.infra_count), None, Some(m.infra));
        }

        println!();
        println!("targets:");
        for h in &self.handlers {
            let (p50, p99) = h.ratios();
            println!(
                "  {}: one at a time p50 ≤ {P50_TARGET}× floor: {} ({}); p99 ≤ {P99_TARGET}× floor p99: {} ({})",
                h.handler,
                verdict(p50.map(|r| r <= P50_TARGET)),
                ratio(p50),
                verdict(p99.map(|r| r <= P99_TARGET)),
                ratio(p99)
            );
        }
        if let Some(runc) = self.handlers.iter().find(|h| h.handler == "runc") {
            let rate = runc.burst_rate();
            let p99 = fig(&runc.burst.berth_since_created).p99_ms;
            println!(
                "  runc burst of {}: ≥ {BURST_RATE_TARGET} pods/s: {} ({} pods/s); per-pod p99 (creation → Running) ≤ \
                 {BURST_P99_TARGET_MS} ms: {} ({} ms)",
                self.burst,
                verdict(rate.map(|r| r >= BURST_RATE_TARGET)),
                rate.map_or_else(|| "-".to_owned(), |r| format!("{r:.1}")),
                verdict(p99.map(|p| p <= BURST_P99_TARGET_MS)),
                ms(p99)
            );
            if let Some(fb) = &runc.floor_burst {
                // Pods created together queue for the machine: the last of them waits for all the others.
                let bound_ms = 0.99 * fb.done.len() as f64 / fb.rate() * 1000.0;
                println!(
                    "    floor: the raw runtime + CNI ADD start at most {:.1} pods/s here ({} at a time), so {} pods \
                     created at once cannot all be Running with a p99 under {bound_ms:.0} ms",
                    fb.rate(),
                    fb.parallel,
                    fb.done.len()
                );
            }
        }
        // PSS: the berth processes all map the one binary, whose pages VmRSS counts once per process.
        let idle = self.idle_memory.total();
        println!(
            "  tree PSS idle ≤ {IDLE_TARGET_MIB} MiB: {} ({:.1} MiB; VmRSS summed {:.1} MiB)",
            verdict(Some(mib(idle.pss_kib) <= IDLE_TARGET_MIB)),
            mib(idle.pss_kib),
            mib(idle.rss_kib)
        );
        if let Some((h, n, m)) = busy {
            let busy = m.total();
            println!(
                "  tree PSS with {n} {h} pods ≤ {BUSY_TARGET_MIB} MiB: {} ({:.1} MiB; VmRSS summed {:.1} MiB; monitors apart)",
                verdict(Some(mib(busy.pss_kib) <= BUSY_TARGET_MIB)),
                mib(busy.pss_kib),
                mib(busy.rss_kib)
            );
        }
    }

    pub fn to_json(&self) -> Value {
        let lat = |l: &Latencies| {
            let f = fig(l);
            json!({"p50_ms": f.p50_ms, "p99_ms": f.p99_ms, "samples": f.samples})
        };
        let shape = |s: &Shape| {
            json!({
                "berth": lat(&s.berth),
                "berth_failed": s.berth_failed,
                "containerd": lat(&s.containerd),
                "berth_wall_s": s.wall.map(|w| w.as_secs_f64()),
                "berth_since_created": lat(&s.berth_since_created),
            })
        };
        let memory = |m: &TreeMemory| {
            let usage = |u: &Usage| json!({"rss_kib": u.rss_kib, "pss_kib": u.pss_kib});
            let parts: serde_json::Map<String, Value> = m.parts.iter().map(|(n, u)| (n.clone(), usage(u))).collect();
            json!({
                "parts": parts,
                "tree": usage(&m.total()),
                "monitors": usage(&m.monitors),
                "monitor_count": m.monitor_count,
                "infra": usage(&m.infra),
                "infra_count": m.infra_count,
            })
        };
        let handlers: Vec<Value> = self
            .handlers
            .iter()
            .map(|h| {
                let (p50, p99) = h.ratios();
                json!({
                    "handler": h.handler,
                    "floor": lat(&h.floor),
                    "floor_run": lat(&h.floor_run),
                    "floor_cni_add": lat(&h.floor_cni_add),
                    "one_at_a_time": shape(&h.one_at_a_time),
                    "waves": shape(&h.waves),
                    "burst": shape(&h.burst),
                    "burst_pods_per_s": h.burst_rate(),
                    "containerd_burst_wall_s": h.containerd_burst_wall.map(|w| w.as_secs_f64()),
                    "floor_burst": h.floor_burst.as_ref().map(|fb| json!({
                        "parallel": fb.parallel,
                        "done": lat(&fb.done),
                        "wall_s": fb.wall.as_secs_f64(),
                        "pods_per_s": fb.rate(),
                    })),
                    "p50_over_floor": p50,
                    "p99_over_floor": p99,
                })
            })
            .collect();
        json!({
            "pods": self.pods,
            "wave": self.wave,
            "burst": self.burst,
            "warmup": self.warmup,
            "image": self.image,
            "up_s": self.up_took.as_secs_f64(),
            "berth": self.berth_version,
            "containerd": self.containerd_version,
            "floor_plugins": self.floor_plugins,
            "memory_idle": memory(&self.idle_memory),
            "memory_busy": self.busy_memory.as_ref().map(|(h, n, m)| json!({"handler": h, "pods": n, "memory": memory(m)})),
            "handlers": handlers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_start_is_counted_apart_and_voids_the_burst_rate() {
        let mut h = HandlerResult::new("runc");
        for _ in 0..4 {
            h.burst.record_berth(&Start { took: Duration::from_millis(500), ended: Ended::Running });
        }
        h.burst.wall = Some(Duration::from_secs(2));
        assert_eq!(h.burst_rate(), Some(2.0));
        h.burst.record_berth(&Start { took: Duration::from_secs(90), ended: Ended::Failed("timeout".into()) });
        assert_eq!(h.burst.berth.len(), 4);
        assert_eq!(h.burst.berth_failed, ["timeout"]);
        assert_eq!(h.burst_rate(), None, "a burst with a failed pod has no rate");
    }

    #[test]
    fn the_ratios_divide_the_one_at_a_time_starts_by_the_floor() {
        let mut h = HandlerResult::new("crun");
        h.floor.record(Duration::from_millis(100));
        h.one_at_a_time.record_berth(&Start { took: Duration::from_millis(150), ended: Ended::Running });
        let (p50, p99) = h.ratios();
        assert!((p50.unwrap() - 1.5).abs() < 0.01, "{p50:?}");
        assert!((p99.unwrap() - 1.5).abs() < 0.01, "{p99:?}");
        assert_eq!(HandlerResult::new("gvisor").ratios(), (None, None));
    }
}
