//! The printed table, the headline ratios and the JSON file.

use serde_json::{Value, json};

use crate::stats::Figure;

/// The watch delivery p99 berth aims at.
pub const WATCH_P99_TARGET_MS: f64 = 5.0;

pub struct Report {
    pub ops: usize,
    pub list_size: usize,
    pub value_bytes: usize,
    pub concurrency: usize,
    pub figures: Vec<Figure>,
}

fn cell(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.decimals$}"))
}

impl Report {
    fn find(&self, backend: &str, metric: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| f.backend == backend && f.metric == metric)
    }

    fn rate(&self, backend: &str, metric: &str) -> Option<f64> {
        self.find(backend, metric).and_then(|f| f.ops_per_sec)
    }

    /// API creates/s on SQLite ÷ raw etcd puts/s, for 1 client and for `concurrency` clients.
    fn ratios(&self) -> [(usize, Option<f64>); 2] {
        [1, self.concurrency].map(|c| {
            let suffix = if c == 1 { "1 client".to_owned() } else { format!("{c} clients") };
            let api = self.rate("sqlite", &format!("create ({suffix})"));
            let raw = self.rate("etcd raw", &format!("put ({suffix})"));
            (c, api.zip(raw).map(|(a, r)| a / r))
        })
    }

    fn watch_p99s(&self) -> Vec<(String, f64)> {
        self.figures
            .iter()
            .filter(|f| f.metric == "watch delivery")
            .filter_map(|f| Some((f.backend.clone(), f.p99_ms?)))
            .collect()
    }

    pub fn print(&self) {
        println!();
        println!(
            "berth-bench api: {} ops per metric, lists of {} objects, values of {} bytes",
            self.ops, self.list_size, self.value_bytes
        );
        println!();
        println!(
            "{:<10} {:<22} {:>10} {:>10} {:>10} {:>8}",
            "backend", "metric", "p50 ms", "p99 ms", "ops/s", "samples"
        );
        println!("{}", "-".repeat(75));
        for f in &self.figures {
            println!(
                "{:<10} {:<22} {:>10} {:>10} {:>10} {:>8}",
                f.backend,
                f.metric,
                cell(f.p50_ms, 3),
                cell(f.p99_ms, 3),
                cell(f.ops_per_sec, 0),
                f.samples
            );
        }
        println!();
        for (c, ratio) in self.ratios() {
            println!("API creates/s on SQLite ÷ raw etcd puts/s, {c:>2} client(s): {}", cell(ratio, 2));
        }
        for (backend, p99) in self.watch_p99s() {
            let verdict = if p99 <= WATCH_P99_TARGET_MS { "within" } else { "OVER" };
            println!("watch delivery p99 on {backend}: {p99:.3} ms, {verdict} the {WATCH_P99_TARGET_MS} ms target");
        }
    }

    pub fn to_json(&self) -> Value {
        let figures: Vec<Value> = self
            .figures
            .iter()
            .map(|f| {
                json!({
                    "backend": f.backend, "metric": f.metric, "p50_ms": f.p50_ms, "p99_ms": f.p99_ms,
                    "ops_per_sec": f.ops_per_sec, "samples": f.samples,
                })
            })
            .collect();
        let ratios: Vec<Value> = self
            .ratios()
            .iter()
            .map(|(c, r)| json!({"clients": c, "sqlite_api_creates_per_raw_etcd_puts": r}))
            .collect();
        let watch: Vec<Value> = self
            .watch_p99s()
            .iter()
            .map(|(b, p99)| json!({"backend": b, "p99_ms": p99, "within_target": *p99 <= WATCH_P99_TARGET_MS}))
            .collect();
        json!({
            "ops": self.ops,
            "list_size": self.list_size,
            "value_bytes": self.value_bytes,
            "figures": figures,
            "sqlite_api_vs_raw_etcd": ratios,
            "watch_p99_target_ms": WATCH_P99_TARGET_MS,
            "watch_p99": watch,
        })
    }
}
