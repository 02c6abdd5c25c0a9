//! The figures of the cluster bench's runs, printed side by side next to their targets and as
//! JSON.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Plan;
use super::calls::{Call, CallStats, Verb};
use super::observe::{Listing, PodTimes};
use super::usage::{self, Sample};
use crate::stats::Latencies;

pub const STARTUP_P99_TARGET_S: f64 = 5.0;
pub const MUTATING_P99_TARGET_MS: f64 = 1000.0;
pub const GET_P99_TARGET_MS: f64 = 1000.0;
pub const LIST_TARGET_S: f64 = 30.0;
pub const SERVER_RSS_TARGET_MIB: f64 = 2048.0;
/// The series are printed in windows of this length.
const SERIES_WINDOW: Duration = Duration::from_secs(10);

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not measured (the run did not get that far).
    NotRun,
    /// Every pod Running.
    Complete,
    /// `--timeout` was reached first.
    TimedOut,
    /// The pod counts stood still from this point (since the Deployments were created).
    Stalled(Duration),
    Failed(String),
}

impl Outcome {
    fn short(&self) -> String {
        match self {
            Outcome::NotRun => "not run".into(),
            Outcome::Complete => "complete".into(),
            Outcome::TimedOut => "TIMED OUT".into(),
            Outcome::Stalled(at) => format!("STALLED at {:.0} s", at.as_secs_f64()),
            Outcome::Failed(_) => "FAILED".into(),
        }
    }
}

/// Warnings and errors in the server's log.
#[derive(Clone, Debug, Default)]
pub struct LogSummary {
    pub warnings: usize,
    pub errors: usize,
    /// The first few distinct ones.
    pub samples: Vec<String>,
}

impl LogSummary {
    pub fn read(path: &Path) -> Self {
        let mut out = Self::default();
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for line in text.lines() {
            let (warn, error) = (line.contains(" WARN "), line.contains(" ERROR "));
            out.warnings += usize::from(warn);
            out.errors += usize::from(error);
            if (warn || error) && out.samples.len() < 8 {
                // Past the timestamp; cut long lines.
                let msg: String = line.split_once(' ').map_or(line, |(_, m)| m).trim().chars().take(240).collect();
                let key: String = msg.chars().take(60).collect();
                if !out.samples.iter().any(|s| s.starts_with(&key)) {
                    out.samples.push(msg);
                }
            }
        }
        out
    }
}

/// What one run measured.
pub struct RunResult {
    pub plan: Plan,
    pub outcome: Outcome,
    /// Hollow nodes registered with their watches open.
    pub registered: Option<Duration>,
    /// When the Deployments were created: the origin of the run's times.
    pub deployments_at: Option<Instant>,
    pub all_running: Option<Duration>,
    pub times: Option<PodTimes>,
    pub calls: BTreeMap<Call, CallStats>,
    pub listings: Vec<Listing>,
    /// Names of the sampled processes, in the order of the samples' readings.
    pub processes: Vec<String>,
    pub samples: Vec<Sample>,
    pub watch_errors: u64,
    pub observer_errors: u64,
    pub patches_given_up: u64,
    pub server_log: LogSummary,
}

/// Figures derived from a run's pod times.
#[derive(Default)]
struct PodFigures {
    startup: Latencies,
    to_bound: Latencies,
    seen: usize,
    bound: usize,
    running: usize,
    bound_per_sec: Option<f64>,
    busiest_second: Option<usize>,
}

fn pod_figures(times: &PodTimes) -> PodFigures {
    let mut f = PodFigures {
        seen: times.seen.len(),
        bound: times.bound.len(),
        running: times.running.len(),
        ..Default::default()
    };
    for (name, seen) in &times.seen {
        if let Some(r) = times.running.get(name) {
            f.startup.record(r.saturating_duration_since(*seen));
        }
        if let Some(b) = times.bound.get(name) {
            f.to_bound.record(b.saturating_duration_since(*seen));
        }
    }
    let first = times.seen.values().min();
    let last = times.bound.values().max();
    if let (Some(first), Some(last)) = (first, last) {
        let span = last.saturating_duration_since(*first).as_secs_f64();
        if span > 0.0 {
            f.bound_per_sec = Some(times.bound.len() as f64 / span);
        }
        let mut per_second: HashMap<u64, usize> = HashMap::new();
        for b in times.bound.values() {
            *per_second.entry(b.saturating_duration_since(*first).as_secs()).or_default() += 1;
        }
        f.busiest_second = per_second.values().max().copied();
    }
    f
}

fn secs(ms: Option<f64>) -> Option<f64> {
    ms.map(|m| m / 1000.0)
}

impl RunResult {
    pub fn new(plan: Plan) -> Self {
        Self {
            plan,
            outcome: Outcome::NotRun,
            registered: None,
            deployments_at: None,
            all_running: None,
            times: None,
            calls: BTreeMap::new(),
            listings: Vec::new(),
            processes: Vec::new(),
            samples: Vec::new(),
            watch_errors: 0,
            observer_errors: 0,
            patches_given_up: 0,
            server_log: LogSummary::default(),
        }
    }

    pub fn label(&self) -> String {
        format!("{} {}n/{}p", self.plan.store.name(), self.plan.nodes, self.plan.pods)
    }

    fn pods(&self) -> PodFigures {
        self.times.as_ref().map(pod_figures).unwrap_or_default()
    }

    /// The latencies of every call of `verb`.
    fn verb(&self, verb: Verb) -> Latencies {
        let mut all = Latencies::default();
        for (call, stats) in &self.calls {
            if call.verb() == verb {
                all.add(&stats.latencies);
            }
        }
        all
    }

    fn call_p99_ms(&self, call: Call) -> Option<f64> {
        self.calls.get(&call).and_then(|s| s.latencies.quantile_ms(0.99))
    }

    fn slowest_list_s(&self) -> Option<f64> {
        self.listings.iter().map(|l| l.took.as_secs_f64()).reduce(f64::max)
    }

    fn failures(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for (call, stats) in &self.calls {
            for (kind, n) in &stats.failures {
                *out.entry(format!("{} {kind}", call.name())).or_default() += n;
            }
        }
        out
    }

    fn process(&self, name: &str) -> (Option<f64>, Option<f64>) {
        match self.processes.iter().position(|p| p == name) {
            Some(p) => usage::peak_and_mean(&self.samples, p),
            None => (None, None),
        }
    }

    pub fn summary(&self) -> String {
        let pods = self.pods();
        format!(
            "{}: {} of {} pods Running, startup p99 {} s, {} bound/s, server RSS peak {} MiB",
            self.outcome.short(),
            pods.running,
            self.plan.pods,
            cell(secs(pods.startup.quantile_ms(0.99)), 2),
            cell(pods.bound_per_sec, 0),
            cell(self.process("server").0, 0)
        )
    }

    fn to_json(&self) -> Value {
        let pods = self.pods();
        let q = |l: &Latencies| json!({"p50_ms": l.quantile_ms(0.5), "p90_ms": l.quantile_ms(0.9), "p99_ms": l.quantile_ms(0.99), "max_ms": l.max_ms(), "samples": l.len()});
        let calls: serde_json::Map<String, Value> = self
            .calls
            .iter()
            .map(|(c, s)| (c.name().to_owned(), json!({"latency": q(&s.latencies), "failures": s.failures})))
            .collect();
        let series: serde_json::Map<String, Value> = self
            .processes
            .iter()
            .enumerate()
            .map(|(p, name)| {
                let (peak, mean) = usage::peak_and_mean(&self.samples, p);
                let w: Vec<Value> = usage::windows(&self.samples, p, SERIES_WINDOW)
                    .iter()
                    .map(|w| json!({"at_s": w.at.as_secs_f64(), "rss_mib": w.rss_mib, "cores": w.cores}))
                    .collect();
                (name.clone(), json!({"rss_peak_mib": peak, "cores_mean": mean, "series": w}))
            })
            .collect();
        json!({
            "store": self.plan.store.name(),
            "nodes": self.plan.nodes,
            "pods": self.plan.pods,
            "outcome": format!("{:?}", self.outcome),
            "registered_s": self.registered.map(|d| d.as_secs_f64()),
            "all_running_s": self.all_running.map(|d| d.as_secs_f64()),
            "pods_seen": pods.seen,
            "pods_bound": pods.bound,
            "pods_running": pods.running,
            "pod_startup": q(&pods.startup),
            "pod_seen_to_bound": q(&pods.to_bound),
            "bound_per_sec": pods.bound_per_sec,
            "bound_busiest_second": pods.busiest_second,
            "mutating": q(&self.verb(Verb::Mutating)),
            "get": q(&self.verb(Verb::Get)),
            "calls": calls,
            "lists": self.listings.iter().map(|l| json!({
                "at_s": l.at.as_secs_f64(), "took_s": l.took.as_secs_f64(), "pods": l.pods, "bytes": l.bytes, "error": l.error,
            })).collect::<Vec<_>>(),
            "processes": series,
            "node_watch_errors": self.watch_errors,
            "bench_watch_errors": self.observer_errors,
            "pod_patches_given_up": self.patches_given_up,
            "server_log": {"warnings": self.server_log.warnings, "errors": self.server_log.errors, "samples": self.server_log.samples},
        })
    }
}

pub struct Report {
    pub status_workers: usize,
    pub runs: Vec<RunResult>,
}

fn cell(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.decimals$}"))
}

/// A cell that is marked when it misses its ceiling.
fn against(v: Option<f64>, decimals: usize, ceiling: f64) -> String {
    match v {
        Some(x) if x > ceiling => format!("{x:.decimals$} (!)"),
        _ => cell(v, decimals),
    }
}

impl Report {
    pub fn print(&self) {
        println!();
        println!(
            "berth-bench cluster: hollow nodes against berth server (scheduler and controllers in process), \
             pod status patches ≤ {} in flight",
            self.status_workers
        );
        println!();
        let pods: Vec<PodFigures> = self.runs.iter().map(RunResult::pods).collect();
        let mut header = format!("{:<34}", "");
        for r in &self.runs {
            header += &format!("{:>22}", r.label());
        }
        println!("{header}   target");
        let row = |name: &str, cells: Vec<String>, target: &str| {
            let mut line = format!("{name:<34}");
            for c in cells {
                line += &format!("{c:>22}");
            }
            println!("{line}   {target}");
        };
        let each = |f: &dyn Fn(usize, &RunResult) -> String| -> Vec<String> {
            self.runs.iter().enumerate().map(|(i, r)| f(i, r)).collect()
        };
        row("outcome", each(&|_, r| r.outcome.short()), "");
        row("nodes registered + watching (s)", each(&|_, r| cell(r.registered.map(|d| d.as_secs_f64()), 1)), "");
        row(
            "pods seen / bound / Running",
            each(&|i, _| format!("{}/{}/{}", pods[i].seen, pods[i].bound, pods[i].running)),
            "",
        );
        row("Deployments → all Running (s)", each(&|_, r| cell(r.all_running.map(|d| d.as_secs_f64()), 1)), "");
        for (q, name) in [(0.5, "p50"), (0.9, "p90")] {
            row(&format!("pod startup {name} (s)"), each(&|i, _| cell(secs(pods[i].startup.quantile_ms(q)), 2)), "");
        }
        row(
            "pod startup p99 (s)",
            each(&|i, _| against(secs(pods[i].startup.quantile_ms(0.99)), 2, STARTUP_P99_TARGET_S)),
            &format!("≤ {STARTUP_P99_TARGET_S}"),
        );
        row("pod seen → bound p99 (s)", each(&|i, _| cell(secs(pods[i].to_bound.quantile_ms(0.99)), 2)), "");
        row("scheduling: bound/s, mean", each(&|i, _| cell(pods[i].bound_per_sec, 0)), "");
        row("scheduling: bound/s, busiest 1 s", each(&|i, _| cell(pods[i].busiest_second.map(|n| n as f64), 0)), "");
        row(
            "API mutating p99 (ms)",
            each(&|_, r| against(r.verb(Verb::Mutating).quantile_ms(0.99), 1, MUTATING_P99_TARGET_MS)),
            &format!("≤ {MUTATING_P99_TARGET_MS}"),
        );
        for call in [Call::RenewLease, Call::PatchPodStatus, Call::PatchNodeStatus, Call::CreateNode] {
            row(&format!("  {} p99 (ms)", call.name()), each(&|_, r| cell(r.call_p99_ms(call), 1)), "");
        }
        row(
            "API GET pod p99 (ms)",
            each(&|_, r| against(r.call_p99_ms(Call::GetPod), 1, GET_P99_TARGET_MS)),
            &format!("≤ {GET_P99_TARGET_MS}"),
        );
        row(
            "LIST all pods, slowest (s)",
            each(&|_, r| against(r.slowest_list_s(), 2, LIST_TARGET_S)),
            &format!("≤ {LIST_TARGET_S}"),
        );
        for process in ["server", "bench", "etcd"] {
            if !self.runs.iter().any(|r| r.processes.iter().any(|p| p == process)) {
                continue;
            }
            let ceiling = if process == "server" { SERVER_RSS_TARGET_MIB } else { f64::INFINITY };
            let target = if process == "server" { format!("≤ {SERVER_RSS_TARGET_MIB}") } else { String::new() };
            row(&format!("{process} RSS peak (MiB)"), each(&|_, r| against(r.process(process).0, 0, ceiling)), &target);
            row(&format!("{process} CPU mean (cores)"), each(&|_, r| cell(r.process(process).1, 2)), "");
        }
        row("failed calls", each(&|_, r| r.failures().values().sum::<u64>().to_string()), "");
        row("watch errors (nodes / bench)", each(&|_, r| format!("{}/{}", r.watch_errors, r.observer_errors)), "");
        row("pods given up by hollow nodes", each(&|_, r| r.patches_given_up.to_string()), "");
        row(
            "server log WARN / ERROR lines",
            each(&|_, r| format!("{}/{}", r.server_log.warnings, r.server_log.errors)),
            "",
        );
        println!("(!) misses its target");
        for r in &self.runs {
            self.print_details(r);
        }
    }

    fn print_details(&self, r: &RunResult) {
        println!();
        println!("{}:", r.label());
        if let Outcome::Failed(why) = &r.outcome {
            println!("  failed: {why}");
        }
        for l in &r.listings {
            match &l.error {
                None => println!(
                    "  LIST all pods at {:.0} s: {:.2} s, {} pods, {:.1} MiB",
                    l.at.as_secs_f64(),
                    l.took.as_secs_f64(),
                    l.pods.map_or("?".to_owned(), |n| n.to_string()),
                    l.bytes as f64 / 1048576.0
                ),
                Some(e) => println!(
                    "  LIST all pods at {:.0} s: failed after {:.2} s: {e}",
                    l.at.as_secs_f64(),
                    l.took.as_secs_f64()
                ),
            }
        }
        for (call, stats) in &r.calls {
            let l = &stats.latencies;
            println!(
                "  {:<20} {:>7} calls  p50 {:>8} ms  p99 {:>8} ms  max {:>8} ms{}",
                call.name(),
                l.len(),
                cell(l.quantile_ms(0.5), 1),
                cell(l.quantile_ms(0.99), 1),
                cell(l.max_ms(), 1),
                if stats.failures.is_empty() { String::new() } else { format!("  failures {:?}", stats.failures) }
            );
        }
        for (p, name) in r.processes.iter().enumerate() {
            let w = usage::windows(&r.samples, p, SERIES_WINDOW);
            let series: Vec<String> =
                w.iter().map(|w| format!("{:.0}s {:.0}MiB/{:.2}", w.at.as_secs_f64(), w.rss_mib, w.cores)).collect();
            println!("  {name} RSS/cores every {} s: {}", SERIES_WINDOW.as_secs(), series.join("  "));
        }
        for s in &r.server_log.samples {
            println!("  server log: {s}");
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "status_workers": self.status_workers,
            "targets": {
                "pod_startup_p99_s": STARTUP_P99_TARGET_S,
                "mutating_p99_ms": MUTATING_P99_TARGET_MS,
                "get_p99_ms": GET_P99_TARGET_MS,
                "list_all_pods_s": LIST_TARGET_S,
                "server_rss_mib": SERVER_RSS_TARGET_MIB,
            },
            "runs": self.runs.iter().map(RunResult::to_json).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn startup_and_throughput_come_from_the_watch_times() {
        let t0 = Instant::now();
        let mut times = PodTimes::default();
        for i in 0..10u64 {
            let name = format!("p-{i}");
            times.seen.insert(name.clone(), t0);
            times.bound.insert(name.clone(), t0 + Duration::from_millis(100 * i));
            if i < 9 {
                times.running.insert(name, t0 + Duration::from_millis(100 * i + 500));
            }
        }
        let f = pod_figures(&times);
        assert_eq!((f.seen, f.bound, f.running), (10, 10, 9));
        assert_eq!(f.startup.len(), 9);
        assert!((f.startup.quantile_ms(0.99).unwrap() - 1300.0).abs() < 2.0);
        assert!((f.bound_per_sec.unwrap() - 10.0 / 0.9).abs() < 1e-6);
        assert_eq!(f.busiest_second, Some(10));
    }

    #[test]
    fn a_value_over_its_ceiling_is_marked() {
        assert_eq!(against(Some(6.0), 1, 5.0), "6.0 (!)");
        assert_eq!(against(Some(4.0), 1, 5.0), "4.0");
        assert_eq!(against(None, 1, 5.0), "n/a");
    }
}
