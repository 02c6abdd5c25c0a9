//! `berth-bench services`: the Service proxy and the cluster DNS, each figure next to its floor
//! measured in the same run.
//!
//! 1. **Rule sync at scale** (no cluster): synthetic Services of two endpoints each, their rules
//!    applied by `berth_proxy` inside a throwaway network namespace: the full table (computing
//!    the rules and the `nft` transaction timed apart) and one endpoint change at that size (one
//!    netlink batch, as the proxy applies changes; the same changes through `nft -j` beside it);
//!    floors: the same table loaded from its text form by one `nft -f`, and one `nft -f` that
//!    adds one element to a small set (one nft process and a trivial transaction).
//! 2. **Service created → first connection** (`--kubeconfig`): one backend pod, then Services
//!    selecting it created one after another, each timed from its create to the first TCP
//!    connect from this host to its ClusterIP that reaches the pod; floor: from the create to its
//!    EndpointSlice (with an endpoint) arriving through a watch, which no proxy can beat.
//! 3. **DNS**: A queries from concurrent UDP clients against the cluster DNS, next to the same
//!    load against a UDP echo server on loopback in this process (the packet path itself).
//!
//! Figures are printed (and written as JSON with `--json`), never asserted. The namespace,
//! tables and API objects the run creates are removed again, also on error and on Ctrl-C.

mod connect;
mod dns;
mod report;
mod rules;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use self::report::Report;

/// busybox serving `/hostname` with the pod's name, as agnhost's netexec does.
const BUSYBOX_HTTPD: &str = "mkdir -p /www && hostname > /www/hostname && exec httpd -f -p 8080 -h /www";

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Backend {
    /// agnhost `netexec --http-port=8080`.
    Agnhost,
    /// busybox `httpd -f -p 8080`, serving `/hostname`.
    Busybox,
}

#[derive(clap::Args)]
pub struct ServicesArgs {
    /// Synthetic Services in the rule sync (two endpoints each).
    #[arg(long, default_value_t = 5000)]
    services: usize,
    /// One-endpoint changes timed at that size.
    #[arg(long, default_value_t = 20)]
    changes: usize,
    /// Full table applies timed (and floor loads).
    #[arg(long, default_value_t = 3)]
    full_repeats: usize,
    /// The nft binary.
    #[arg(long, default_value = "nft")]
    nft: PathBuf,
    /// Skip the rule sync.
    #[arg(long)]
    no_rules: bool,
    /// A cluster for the connection and DNS parts; without it only the rule sync and the DNS
    /// floor (and `--dns`, if given) run.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Services created, one after another, in the connection part.
    #[arg(long, default_value_t = 100)]
    count: usize,
    /// What the backend pod serves port 8080 with.
    #[arg(long, value_enum, default_value = "agnhost")]
    backend: Backend,
    /// The backend's image (default: agnhost 2.45 or busybox 1.28, after `--backend`).
    #[arg(long)]
    image: Option<String>,
    /// Seconds each Service may take to take its first connection.
    #[arg(long, default_value_t = 10)]
    connect_timeout: u64,
    /// Skip the connection part.
    #[arg(long)]
    no_connect: bool,
    /// The cluster DNS (default: the `kube-system/kube-dns` EndpointSlice's UDP endpoint).
    #[arg(long)]
    dns: Option<SocketAddr>,
    /// The name asked for (type A).
    #[arg(long, default_value = "kubernetes.default.svc.cluster.local.")]
    dns_name: String,
    /// Concurrent UDP clients.
    #[arg(long, default_value_t = 8)]
    dns_clients: usize,
    /// Seconds of load against each server.
    #[arg(long, default_value_t = 5)]
    dns_seconds: u64,
    /// Skip the DNS part.
    #[arg(long)]
    no_dns: bool,
    /// Also write the figures here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub async fn run(args: ServicesArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    anyhow::ensure!(args.dns_clients > 0 && args.count > 0, "--dns-clients and --count must be positive");
    // Ctrl-C stops each part at its next step; the part then cleans up as on error.
    let stop = Arc::new(AtomicBool::new(false));
    let on_signal = {
        let stop = stop.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("interrupted: cleaning up");
                stop.store(true, Ordering::SeqCst);
            }
        })
    };
    let outcome = measure(&args, &stop).await;
    on_signal.abort();
    let report = outcome?;
    report.print();
    crate::finish_run(args.json.as_deref(), || report.to_json(), started)
}

async fn measure(args: &ServicesArgs, stop: &Arc<AtomicBool>) -> anyhow::Result<Report> {
    let mut report = Report::default();
    if !args.no_rules {
        let settings = rules::Settings {
            services: args.services,
            changes: args.changes,
            full_repeats: args.full_repeats,
            nft: args.nft.clone(),
        };
        eprintln!("rule sync: {} Services × 2 endpoints", args.services);
        report.rules = Some(rules::run(settings, stop.clone()).await.context("rule sync")?);
    }
    let client = match &args.kubeconfig {
        Some(path) => Some(crate::agent::cluster::client(path).await?),
        None => {
            report.notes.push("no --kubeconfig: Service → first connection not measured".to_owned());
            None
        }
    };
    if let Some(client) = &client
        && !args.no_connect
        && !stop.load(Ordering::SeqCst)
    {
        let (image, command) = match args.backend {
            Backend::Agnhost => {
                ("registry.k8s.io/e2e-test-images/agnhost:2.45", ["/agnhost", "netexec", "--http-port=8080"])
            }
            Backend::Busybox => ("docker.io/library/busybox:1.28", ["sh", "-c", BUSYBOX_HTTPD]),
        };
        let settings = connect::Settings {
            count: args.count,
            image: args.image.clone().unwrap_or_else(|| image.to_owned()),
            command: command.map(str::to_owned).to_vec(),
            timeout: Duration::from_secs(args.connect_timeout),
        };
        report.connect =
            Some(connect::run(client.clone(), settings, stop.clone()).await.context("Service → connection")?);
    }
    if !args.no_dns && !stop.load(Ordering::SeqCst) {
        let target = match (args.dns, &client) {
            (Some(addr), _) => Some(addr),
            (None, Some(client)) => Some(dns::cluster_dns(client).await?),
            (None, None) => {
                report.notes.push("no --kubeconfig nor --dns: cluster DNS not measured, only its floor".to_owned());
                None
            }
        };
        let settings = dns::Settings {
            name: args.dns_name.clone(),
            clients: args.dns_clients,
            duration: Duration::from_secs(args.dns_seconds),
        };
        report.dns = Some(dns::run(target, settings, stop.clone()).await.context("DNS")?);
    }
    Ok(report)
}
