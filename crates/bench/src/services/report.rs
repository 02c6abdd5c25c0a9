//! The printed tables, with each figure's ratio to its floor, and the JSON file.

use serde_json::{Value, json};

use super::connect;
use super::dns::{self, Load};
use super::rules;
use crate::stats::Latencies;

/// One endpoint change at 5,000 Services should reach the kernel within this.
pub const CHANGE_TARGET_MS: f64 = 50.0;

#[derive(Default)]
pub struct Report {
    pub rules: Option<rules::Figures>,
    pub connect: Option<connect::Figures>,
    pub dns: Option<dns::Figures>,
    pub notes: Vec<String>,
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    a.zip(b).filter(|(_, b)| *b > 0.0).map_or_else(|| "-".to_owned(), |(a, b)| format!("{:.2}×", a / b))
}

fn p(l: &Latencies, q: f64) -> Option<f64> {
    l.quantile_ms(q)
}

fn header() {
    println!(
        "  {:<56} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9}",
        "", "p50 ms", "p90 ms", "p99 ms", "max ms", "samples", "p50/floor", "p99/floor"
    );
}

/// One latency row; with `floor`, its p50 and p99 over the floor's.
fn row(what: &str, l: &Latencies, floor: Option<&Latencies>) {
    let over = |q| floor.map_or_else(String::new, |f| ratio(p(l, q), p(f, q)));
    println!(
        "  {what:<56} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9}",
        ms(p(l, 0.5)),
        ms(p(l, 0.9)),
        ms(p(l, 0.99)),
        ms(l.max_ms()),
        l.len(),
        over(0.5),
        over(0.99)
    );
}

fn rate(load: &Load) -> f64 {
    load.lat.len() as f64 / load.elapsed.as_secs_f64().max(f64::EPSILON)
}

fn lat_json(l: &Latencies) -> Value {
    json!({"p50_ms": p(l, 0.5), "p90_ms": p(l, 0.9), "p99_ms": p(l, 0.99), "max_ms": l.max_ms(), "samples": l.len()})
}

impl Report {
    pub fn print(&self) {
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        println!();
        println!("berth-bench services: {cpus} CPUs");
        if let Some(r) = &self.rules {
            println!();
            println!(
                "1. rule sync: {} Services × 2 endpoints (ClusterIP, TCP 80 → 8080) in netns {}; the full apply is {} \
                 nft -j commands, the table's text form {} lines ({} KiB); nft forked inside the netns",
                r.services,
                r.netns,
                r.commands,
                r.text_lines,
                r.text_bytes / 1024
            );
            header();
            row("full apply: compute (rules + commands)", &r.full_compute, None);
            row("full apply: nft (berth_proxy::apply, one transaction)", &r.full_nft, None);
            row("full apply: total", &r.full_total, Some(&r.full_floor));
            row("  floor: `nft -f` of the same table as text", &r.full_floor, None);
            row("one endpoint change: compute", &r.change_compute, None);
            row("one endpoint change: kernel (one netlink batch)", &r.change_kernel, None);
            row("one endpoint change: total", &r.change_total, Some(&r.change_floor));
            row("  floor: `nft -f` adding one element to a small set", &r.change_floor, None);
            row("  same-size change via nft -j (berth_proxy::apply)", &r.change_json, None);
            row("  at full size: one map element, berth_proxy::apply", &r.element_json, None);
            row("  at full size: one map element, `nft -f` (text)", &r.element_text, None);
            row("  at full size: one map element, netlink batch", &r.element_netlink, None);
            if let Some(p99) = p(&r.change_total, 0.99) {
                let verdict = if p99 <= CHANGE_TARGET_MS { "within" } else { "OVER" };
                println!(
                    "  one change at {} Services: p99 {p99:.2} ms, {verdict} the {CHANGE_TARGET_MS} ms target",
                    r.services
                );
            }
        }
        if let Some(c) = &self.connect {
            println!();
            println!(
                "2. Service created → first connection: {} ClusterIP Services (TCP 80 → 8080) created one after another \
                 in front of one pod ({}, Ready {:.1} s after its create); from the create's return, a new TCP connect \
                 from this host every 2 ms",
                c.count,
                c.image,
                c.pod_ready.as_secs_f64()
            );
            header();
            row("create → first connect", &c.connect, Some(&c.slice));
            row("  floor: create → EndpointSlice with an endpoint (watch)", &c.slice, None);
            row("EndpointSlice seen → first connect (the proxy's part)", &c.after_slice, None);
            println!("  no connection within the timeout: {}; no EndpointSlice: {}", c.no_connect, c.no_slice);
        }
        if let Some(d) = &self.dns {
            println!();
            println!("3. DNS: A {} from {} concurrent UDP clients, one query in flight each", d.name, d.clients);
            if let (Some(target), Some(answer)) = (d.target, &d.first_answer) {
                println!("  cluster DNS at {target} answers: {answer}");
            }
            println!(
                "  {:<56} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9}",
                "", "queries/s", "p50 ms", "p99 ms", "max ms", "samples", "failed"
            );
            let line = |what: &str, l: &Load| {
                println!(
                    "  {what:<56} {:>9.0} {:>9} {:>9} {:>9} {:>7} {:>9}",
                    rate(l),
                    ms(p(&l.lat, 0.5)),
                    ms(p(&l.lat, 0.99)),
                    ms(l.lat.max_ms()),
                    l.lat.len(),
                    l.failed
                );
            };
            if let Some(c) = &d.cluster {
                line("cluster DNS", c);
            }
            line("  floor: UDP echo on loopback, in this process", &d.floor);
            if let Some(c) = &d.cluster {
                println!(
                    "  cluster DNS ÷ floor: queries/s {}, p50 {}, p99 {}",
                    ratio(Some(rate(c)), Some(rate(&d.floor))),
                    ratio(p(&c.lat, 0.5), p(&d.floor.lat, 0.5)),
                    ratio(p(&c.lat, 0.99), p(&d.floor.lat, 0.99))
                );
            }
        }
        if !self.notes.is_empty() {
            println!();
            for note in &self.notes {
                println!("note: {note}");
            }
        }
    }

    pub fn to_json(&self) -> Value {
        let rules = self.rules.as_ref().map(|r| {
            json!({
                "services": r.services, "commands": r.commands, "text_lines": r.text_lines, "text_bytes": r.text_bytes,
                "full_compute": lat_json(&r.full_compute), "full_nft": lat_json(&r.full_nft),
                "full_total": lat_json(&r.full_total), "full_floor": lat_json(&r.full_floor),
                "change_compute": lat_json(&r.change_compute), "change_kernel": lat_json(&r.change_kernel),
                "change_json": lat_json(&r.change_json), "element_netlink_at_size": lat_json(&r.element_netlink),
                "change_total": lat_json(&r.change_total), "change_floor": lat_json(&r.change_floor),
                "element_json_at_size": lat_json(&r.element_json), "element_text_at_size": lat_json(&r.element_text),
                "change_target_ms": CHANGE_TARGET_MS,
            })
        });
        let connect = self.connect.as_ref().map(|c| {
            json!({
                "services": c.count, "image": c.image, "pod_ready_s": c.pod_ready.as_secs_f64(),
                "create_to_connect": lat_json(&c.connect), "create_to_slice": lat_json(&c.slice),
                "slice_to_connect": lat_json(&c.after_slice), "no_connect": c.no_connect, "no_slice": c.no_slice,
            })
        });
        let load = |l: &Load| json!({"queries_per_sec": rate(l), "latency": lat_json(&l.lat), "failed": l.failed});
        let dns = self.dns.as_ref().map(|d| {
            json!({
                "name": d.name, "clients": d.clients, "target": d.target.map(|t| t.to_string()),
                "cluster": d.cluster.as_ref().map(load), "floor": load(&d.floor),
            })
        });
        json!({"rule_sync": rules, "service_to_connection": connect, "dns": dns, "notes": self.notes})
    }
}
