//! What one run of the cluster bench measured, and the figures derived from it.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Plan;
use super::calls::{Call, CallStats, Verb};
use super::observe::{Listing, PodTimes};
use super::usage::{self, Sample};
use crate::stats::Latencies;

/// The series are printed in windows of this length.
pub const SERIES_WINDOW: Duration = Duration::from_secs(10);

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not measured (the run did not get that far).
    NotRun,
    /// Every pod Running.
    Complete,
    /// `--timeout` was reached first.
    TimedOut,
    /// SIGINT or SIGTERM came first.
    Interrupted,
    /// The pod counts stood still from this point (since the Deployments were created).
    Stalled(Duration),
    Failed(String),
}

impl Outcome {
    pub fn short(&self) -> String {
        match self {
            Outcome::NotRun => "not run".into(),
            Outcome::Complete => "complete".into(),
            Outcome::TimedOut => "TIMED OUT".into(),
            Outcome::Interrupted => "INTERRUPTED".into(),
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
pub struct PodFigures {
    pub startup: Latencies,
    pub to_bound: Latencies,
    pub seen: usize,
    pub bound: usize,
    pub running: usize,
    pub bound_per_sec: Option<f64>,
    pub busiest_second: Option<usize>,
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

/// A figure with `decimals` decimals, or n/a.
pub fn cell(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.decimals$}"))
}

pub fn secs(ms: Option<f64>) -> Option<f64> {
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

    pub fn pods(&self) -> PodFigures {
        self.times.as_ref().map(pod_figures).unwrap_or_default()
    }

    /// The latencies of every call of `verb`.
    pub fn verb(&self, verb: Verb) -> Latencies {
        let mut all = Latencies::default();
        for (call, stats) in &self.calls {
            if call.verb() == verb {
                all.add(&stats.latencies);
            }
        }
        all
    }

    pub fn call_p99_ms(&self, call: Call) -> Option<f64> {
        self.calls.get(&call).and_then(|s| s.latencies.quantile_ms(0.99))
    }

    pub fn slowest_list_s(&self) -> Option<f64> {
        self.listings.iter().map(|l| l.took.as_secs_f64()).reduce(f64::max)
    }

    pub fn failures(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for (call, stats) in &self.calls {
            for (kind, n) in &stats.failures {
                *out.entry(format!("{} {kind}", call.name())).or_default() += n;
            }
        }
        out
    }

    pub fn open_files(&self, name: &str) -> Option<usize> {
        self.processes.iter().position(|p| p == name).and_then(|p| usage::peak_fds(&self.samples, p))
    }

    pub fn process(&self, name: &str) -> (Option<f64>, Option<f64>) {
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

    pub fn to_json(&self) -> Value {
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
                let fds = usage::peak_fds(&self.samples, p);
                (name.clone(), json!({"rss_peak_mib": peak, "cores_mean": mean, "open_files_peak": fds, "series": w}))
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
}
