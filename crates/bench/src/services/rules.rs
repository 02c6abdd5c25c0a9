//! Part 1: the proxy's rules for thousands of synthetic Services, applied in a throwaway network
//! namespace as the proxy applies them (the full table through `nft -j`, changes as netlink
//! batches), next to plain `nft -f` loads of the same table and of a one-element change, and to
//! the same changes through `nft -j`.
//!
//! Everything runs on one thread that joined the namespace, so `nft` (forked from it) and the
//! netlink socket (opened on it) work there directly, as the proxy's do on a node, with no
//! `ip netns exec` in the timings.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use berth_proxy::command::Command;
use berth_proxy::model::{Endpoint, Protocol, ServiceKey, ServicePort};
use berth_proxy::netlink::Netlink;
use berth_proxy::rules::{MapKey, MapName, NodeNetwork, ServiceRules, service_rules};
use berth_proxy::sync::Applied;
use berth_proxy::table::Table;

use crate::cri::net::Netns;
use crate::stats::Latencies;

const TABLE: &str = "berth-bench";
/// The small table of the one-change floor.
const FLOOR_TABLE: &str = "berth-bench-floor";
/// Endpoint addresses come from 10.244.0.0/16, two per Service and one per change.
const MAX_SERVICES: usize = 30_000;

pub struct Settings {
    pub services: usize,
    pub changes: usize,
    pub full_repeats: usize,
    pub nft: PathBuf,
}

pub struct Figures {
    pub services: usize,
    pub netns: String,
    /// `nft -j` commands in the full apply.
    pub commands: usize,
    /// The table's text form, as listed.
    pub text_lines: usize,
    pub text_bytes: usize,
    pub full_compute: Latencies,
    pub full_nft: Latencies,
    pub full_total: Latencies,
    pub full_floor: Latencies,
    pub change_compute: Latencies,
    /// The change's netlink batch, sent and acknowledged.
    pub change_kernel: Latencies,
    pub change_total: Latencies,
    pub change_floor: Latencies,
    /// Other Services' endpoint changes, the same size, through `berth_proxy::apply` (`nft -j`).
    pub change_json: Latencies,
    /// One map element added to the full-size table, by `berth_proxy::apply` (JSON), by `nft -f`
    /// (text) and by a netlink batch: what nft alone costs at that size.
    pub element_json: Latencies,
    pub element_text: Latencies,
    pub element_netlink: Latencies,
}

pub async fn run(settings: Settings, stop: Arc<AtomicBool>) -> anyhow::Result<Figures> {
    ensure!((1..=MAX_SERVICES).contains(&settings.services), "--services must be between 1 and {MAX_SERVICES}");
    ensure!(settings.changes > 0 && settings.full_repeats > 0, "--changes and --full-repeats must be positive");
    // Deleted when dropped, whatever the thread did; the thread keeps the namespace alive
    // until it ends.
    let netns = Netns::new("svc")?;
    let path = netns.path.clone();
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(in_netns(&path, settings, &stop));
    });
    let mut figures = rx.await.context("the rule sync thread died")??;
    figures.netns = name;
    drop(netns);
    Ok(figures)
}

/// Joins the namespace at `path` on this thread and measures there.
fn in_netns(path: &Path, settings: Settings, stop: &AtomicBool) -> anyhow::Result<Figures> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).context("joining the namespace")?;
    // A runtime of this thread only: every nft it forks inherits the namespace.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let dir = tempfile::tempdir()?;
    rt.block_on(measure(&settings, dir.path(), stop))
}

fn key(i: usize) -> ServiceKey {
    ServiceKey::new("bench", &format!("svc-{i}"))
}

/// Service `i`'s ClusterIP: 10.96.1.0 onwards, inside 10.96.0.0/12.
fn cluster_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 1, 0)) + i as u32)
}

/// The `n`th endpoint address: 10.244.0.2 onwards.
fn endpoint_ip(n: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 244, 0, 2)) + n as u32)
}

/// A ClusterIP Service, TCP 80 → 8080 on `endpoints`.
fn port(i: usize, endpoints: [Ipv4Addr; 2]) -> ServicePort {
    let mut endpoints: Vec<Endpoint> =
        endpoints.iter().map(|ip| Endpoint { ip: *ip, port: 8080, local: true }).collect();
    endpoints.sort();
    ServicePort {
        service: key(i),
        name: "http".into(),
        protocol: Protocol::Tcp,
        port: 80,
        cluster_ips: vec![cluster_ip(i)],
        external_ips: vec![],
        node_port: None,
        affinity_timeout: None,
        external_local: false,
        internal_local: false,
        endpoints,
    }
}

fn rules_of(p: &ServicePort) -> ServiceRules {
    let net = NodeNetwork { pod_cidr: Some((Ipv4Addr::new(10, 244, 0, 0), 16)), ..NodeNetwork::default() };
    service_rules(std::slice::from_ref(p), net)
}

fn check(stop: &AtomicBool) -> anyhow::Result<()> {
    if stop.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

async fn measure(settings: &Settings, dir: &Path, stop: &AtomicBool) -> anyhow::Result<Figures> {
    let nft = settings.nft.as_path();
    let n = settings.services;
    let table = Table::new(TABLE);
    let mut figures = Figures {
        services: n,
        netns: String::new(),
        commands: 0,
        text_lines: 0,
        text_bytes: 0,
        full_compute: Latencies::default(),
        full_nft: Latencies::default(),
        full_total: Latencies::default(),
        full_floor: Latencies::default(),
        change_compute: Latencies::default(),
        change_kernel: Latencies::default(),
        change_total: Latencies::default(),
        change_floor: Latencies::default(),
        change_json: Latencies::default(),
        element_json: Latencies::default(),
        element_text: Latencies::default(),
        element_netlink: Latencies::default(),
    };

    // (a) The full table, as the proxy writes it at start: each repeat replaces the last.
    let mut applied = Applied::default();
    for _ in 0..settings.full_repeats {
        check(stop)?;
        let began = Instant::now();
        let all: BTreeMap<ServiceKey, ServiceRules> =
            (0..n).map(|i| (key(i), rules_of(&port(i, [endpoint_ip(2 * i), endpoint_ip(2 * i + 1)])))).collect();
        let (cmds, state) = Applied::rebuild(&table, all);
        let computed = Instant::now();
        figures.commands = cmds.len();
        berth_proxy::apply(nft, cmds).await.context("the full apply")?;
        let done = Instant::now();
        figures.full_compute.record(computed - began);
        figures.full_nft.record(done - computed);
        figures.full_total.record(done - began);
        applied = state;
    }

    // (b) One Service's endpoint replaced, at that size, as the proxy does it (one netlink batch
    // on a socket it keeps); and another's through `nft -j`. Services spread over the table.
    let mut netlink = Netlink::open().context("opening a netlink socket")?;
    let step = (n / settings.changes).max(1);
    for r in 0..settings.changes {
        check(stop)?;
        let i = (r * step) % n;
        let moved = port(i, [endpoint_ip(2 * i), endpoint_ip(2 * n + r)]);
        let began = Instant::now();
        let change = vec![(key(i), Some(rules_of(&moved)))];
        let cmds = applied.changes(&change);
        let computed = Instant::now();
        netlink.apply(TABLE, &cmds).with_context(|| format!("change {r}"))?;
        let done = Instant::now();
        applied.commit(change);
        figures.change_compute.record(computed - began);
        figures.change_kernel.record(done - computed);
        figures.change_total.record(done - began);

        let j = (i + step / 2 + 1) % n;
        let moved = port(j, [endpoint_ip(2 * j), endpoint_ip(2 * n + settings.changes + r)]);
        let began = Instant::now();
        let change = vec![(key(j), Some(rules_of(&moved)))];
        let cmds = applied.changes(&change).iter().map(|c| c.json(&table)).collect();
        berth_proxy::apply(nft, cmds).await.with_context(|| format!("change {r} through nft"))?;
        figures.change_json.record(began.elapsed());
        applied.commit(change);
    }

    // (c) The same table from its text form, in one `nft -f`.
    check(stop)?;
    let listed = nft_output(nft, &["list", "table", "ip", TABLE]).await?;
    figures.text_lines = listed.lines().count();
    figures.text_bytes = listed.len();
    let text = dir.join("table.nft");
    std::fs::write(&text, &listed)?;
    for _ in 0..settings.full_repeats {
        check(stop)?;
        nft_output(nft, &["delete", "table", "ip", TABLE]).await?;
        figures.full_floor.record(nft_file(nft, &text).await.context("loading the listed table")?);
    }

    // One element into the full-size table's map, the two ways, alternating.
    let chain = format!("service-{}", port(0, [endpoint_ip(0), endpoint_ip(1)]).id());
    let element =
        |r: usize| MapKey::Address(Ipv4Addr::new(10, 111, (r / 250) as u8, (r % 250 + 1) as u8), Protocol::Tcp, 80);
    for r in 0..settings.changes {
        check(stop)?;
        let began = Instant::now();
        berth_proxy::apply(nft, vec![table.add_element(MapName::ServiceIps, &element(3 * r), &chain)]).await?;
        figures.element_json.record(began.elapsed());
        let began = Instant::now();
        netlink.apply(TABLE, &[Command::AddElement(MapName::ServiceIps, element(3 * r + 2), chain.clone())])?;
        figures.element_netlink.record(began.elapsed());
        let MapKey::Address(ip, _, _) = element(3 * r + 1) else { unreachable!() };
        let file = dir.join("element.nft");
        std::fs::write(&file, format!("add element ip {TABLE} service-ips {{ {ip} . tcp . 80 : goto {chain} }}\n"))?;
        figures.element_text.record(nft_file(nft, &file).await?);
    }
    berth_proxy::remove_table(nft, TABLE).await?;

    // And one process with a trivial transaction: one element into a small set.
    nft_output(nft, &["add", "table", "ip", FLOOR_TABLE]).await?;
    nft_output(nft, &["add", "set", "ip", FLOOR_TABLE, "s", "{ type ipv4_addr; }"]).await?;
    let files: Vec<PathBuf> = (0..settings.changes)
        .map(|r| {
            let file = dir.join(format!("element-{r}.nft"));
            let line = format!("add element ip {FLOOR_TABLE} s {{ {} }}\n", endpoint_ip(r));
            std::fs::write(&file, line).map(|()| file)
        })
        .collect::<Result<_, _>>()?;
    for file in &files {
        check(stop)?;
        figures.change_floor.record(nft_file(nft, file).await?);
    }
    berth_proxy::remove_table(nft, FLOOR_TABLE).await?;
    Ok(figures)
}

/// Runs nft (not timed), returning its stdout.
async fn nft_output(nft: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = tokio::process::Command::new(nft)
        .args(args)
        .output()
        .await
        .with_context(|| format!("running {}", nft.display()))?;
    ensure!(out.status.success(), "nft {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Times one `nft -f file`, from spawn to exit.
async fn nft_file(nft: &Path, file: &Path) -> anyhow::Result<Duration> {
    let began = Instant::now();
    let out = tokio::process::Command::new(nft).arg("-f").arg(file).output().await?;
    let took = began.elapsed();
    ensure!(out.status.success(), "nft -f {}: {}", file.display(), String::from_utf8_lossy(&out.stderr).trim());
    Ok(took)
}
