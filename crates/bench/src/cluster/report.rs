//! The figures of the cluster bench's runs, printed side by side next to their targets and as
//! JSON.

use serde_json::{Value, json};

use super::calls::{Call, Verb};
use std::time::Duration;

use super::result::{Outcome, PodFigures, RunResult, SERIES_WINDOW, cell, secs};
use super::usage;

pub const STARTUP_P99_TARGET_S: f64 = 5.0;
pub const MUTATING_P99_TARGET_MS: f64 = 1000.0;
pub const GET_P99_TARGET_MS: f64 = 1000.0;
pub const LIST_TARGET_S: f64 = 30.0;
pub const SERVER_RSS_TARGET_MIB: f64 = 2048.0;

/// At most this many windows of a series are printed (the JSON has them all).
const PRINTED_WINDOWS: u64 = 30;

/// The printed series' window for a run of `span`: [`SERIES_WINDOW`], or a multiple of it that
/// keeps the series to [`PRINTED_WINDOWS`].
fn print_window(span: Duration) -> Duration {
    let base = SERIES_WINDOW.as_secs();
    let windows = span.as_secs().div_ceil(base);
    SERIES_WINDOW * u32::try_from(windows.div_ceil(PRINTED_WINDOWS).max(1)).unwrap_or(u32::MAX)
}

pub struct Report {
    pub status_workers: usize,
    /// Pods per second the Deployments were scaled up at; 0: all at once.
    pub create_rate: f64,
    pub runs: Vec<RunResult>,
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
             pod status patches ≤ {} in flight, {}",
            self.status_workers,
            if self.create_rate > 0.0 {
                format!("Deployments scaled up at {} pods/s", self.create_rate)
            } else {
                "all replicas at once".to_string()
            }
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
            if process != "etcd" {
                let fds = |r: &RunResult| r.open_files(process).map_or_else(|| "n/a".to_owned(), |n| n.to_string());
                row(&format!("{process} open files, most"), each(&|_, r| fds(r)), "");
            }
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
            let every = print_window(r.samples.last().map_or(Duration::ZERO, |s| s.at));
            let w = usage::windows(&r.samples, p, every);
            let series: Vec<String> =
                w.iter().map(|w| format!("{:.0}s {:.0}MiB/{:.2}", w.at.as_secs_f64(), w.rss_mib, w.cores)).collect();
            println!("  {name} RSS/cores every {} s: {}", every.as_secs(), series.join("  "));
        }
        for s in &r.server_log.samples {
            println!("  server log: {s}");
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "status_workers": self.status_workers,
            "create_rate": self.create_rate,
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
    fn long_runs_print_their_series_in_longer_windows() {
        assert_eq!(print_window(Duration::from_secs(60)), Duration::from_secs(10));
        assert_eq!(print_window(Duration::from_secs(300)), Duration::from_secs(10));
        assert_eq!(print_window(Duration::from_secs(1000)), Duration::from_secs(40));
        assert_eq!(print_window(Duration::ZERO), Duration::from_secs(10));
    }

    #[test]
    fn a_value_over_its_ceiling_is_marked() {
        assert_eq!(against(Some(6.0), 1, 5.0), "6.0 (!)");
        assert_eq!(against(Some(4.0), 1, 5.0), "4.0");
        assert_eq!(against(None, 1, 5.0), "n/a");
    }
}
