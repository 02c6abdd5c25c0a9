//! `berth-bench`: berth's API, image pulls, CRI pods, node agent, scheduler, controllers and pod
//! startup on a `berth up` cluster, Services and DNS, each next to its floor or reference measured in the same run.

mod agent;
mod api;
mod cluster;
mod controllers;
mod cri;
mod etcd_cluster;
mod etcd_server;
mod image;
mod raw_etcd;
mod report;
mod scheduler;
mod services;
mod startup;
mod stats;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use berth_store::etcd::EtcdStore;
use berth_store::sqlite::SqliteStore;
use clap::{Args, Parser, Subcommand};

use crate::stats::Figure;

#[derive(Parser)]
#[command(
    name = "berth-bench",
    about = "Benchmarks of berth: control plane, image pulls, CRI runtime, node agent, scheduler"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The Kubernetes API over SQLite and over etcd, and raw etcd puts, in one run.
    Api(ApiArgs),
    /// The API on a 3-member etcd cluster through one and two API servers, next to raw etcd puts.
    EtcdCluster(etcd_cluster::EtcdClusterArgs),
    /// Image pull and unpack throughput from a loopback registry, next to `skopeo copy`.
    Image(image::ImageArgs),
    /// CRI pod lifecycles under runc, crun and gVisor, next to the raw OCI runtimes and containerd.
    Cri(cri::CriArgs),
    /// Pod start through server, agent and runtime per handler, next to CRI only and the raw floor.
    Agent(agent::AgentArgs),
    /// Pods scheduled per second on thousands of nodes, next to the raw binding-write rate, and
    /// the scheduler's memory.
    Scheduler(scheduler::SchedulerArgs),
    /// A Deployment's pods created and bound per second on Node objects without agents, next to
    /// the raw API create rate.
    Controllers(controllers::ControllersArgs),
    /// Pod startup on a `berth up` cluster per handler (one at a time, 10 at a time, a
    /// Deployment burst), next to the raw runtime + CNI ADD floor and containerd's CRI path, and
    /// the memory of the whole tree.
    Startup(startup::StartupArgs),
    /// Hollow nodes in one process against a real server, as kubemark: pod startup latency,
    /// API latency by verb, scheduling throughput, server memory and CPU, next to a 100-node run.
    Cluster(cluster::ClusterArgs),
    /// Service rule sync at thousands of Services next to plain `nft -f`, Service created →
    /// first connection next to its EndpointSlice's arrival, and cluster DNS next to a UDP echo.
    Services(services::ServicesArgs),
}

#[derive(Args)]
struct ApiArgs {
    /// Samples per latency metric and creates per single-client run (twice that with many).
    #[arg(long, default_value_t = 2000)]
    ops: usize,
    /// Objects in the listed collection.
    #[arg(long, default_value_t = 1000)]
    list_size: usize,
    /// How many times that collection is listed.
    #[arg(long, default_value_t = 50)]
    list_reps: usize,
    /// Clients of the concurrent runs.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    #[arg(long, default_value = "/usr/bin/etcd")]
    etcd_binary: PathBuf,
    /// Also write the figures here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Api(args) => api_bench(args).await,
        Command::EtcdCluster(args) => etcd_cluster::run(args).await,
        Command::Image(args) => image::run(args).await,
        Command::Cri(args) => cri::run(args).await,
        Command::Agent(args) => agent::run(args).await,
        Command::Scheduler(args) => scheduler::run(args).await,
        Command::Controllers(args) => controllers::run(args).await,
        Command::Startup(args) => startup::run(args).await,
        Command::Services(args) => services::run(args).await,
        Command::Cluster(args) => cluster::run(args).await,
    }
}

async fn api_bench(args: ApiArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    anyhow::ensure!(args.ops > 0 && args.concurrency > 0, "--ops and --concurrency must be positive");
    let settings = api::Settings {
        ops: args.ops,
        list_size: args.list_size,
        list_reps: args.list_reps,
        concurrency: args.concurrency,
    };
    eprintln!("starting etcd ({})", args.etcd_binary.display());
    let etcd = etcd_server::EtcdServer::start(&args.etcd_binary).await?;
    let mut figures: Vec<Figure> = Vec::new();

    eprintln!("API on SQLite");
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("state.db");
    let sqlite = tokio::task::spawn_blocking(move || SqliteStore::open(&path)).await?.context("opening SQLite")?;
    let outcome = api::run("sqlite", Arc::new(sqlite), &settings).await.context("API on SQLite")?;
    figures.extend(outcome.figures);
    let value_bytes = outcome.value_bytes;

    eprintln!("API on etcd");
    let store = EtcdStore::connect(std::slice::from_ref(&etcd.endpoint)).await.context("connecting to etcd")?;
    figures.extend(api::run("etcd", Arc::new(store), &settings).await.context("API on etcd")?.figures);

    for clients in [1, args.concurrency] {
        let total = if clients == 1 { args.ops } else { args.ops * 2 };
        eprintln!("raw etcd: {total} puts of {value_bytes} bytes, {clients} client(s)");
        let (lat, elapsed) = raw_etcd::puts(std::slice::from_ref(&etcd.endpoint), clients, total, value_bytes).await?;
        let metric = if clients == 1 { "put (1 client)".to_owned() } else { format!("put ({clients} clients)") };
        figures.push(Figure::new("etcd raw", &metric, &lat, Some(elapsed)));
    }
    drop(etcd);

    let report = report::Report {
        ops: args.ops,
        list_size: args.list_size,
        value_bytes,
        concurrency: args.concurrency,
        figures,
    };
    report.print();
    crate::finish_run(args.json.as_deref(), || report.to_json(), started)
}

/// Writes a run's figures as JSON where asked, and says how long the run took.
fn finish_run(
    json: Option<&Path>,
    figures: impl FnOnce() -> serde_json::Value,
    started: Instant,
) -> anyhow::Result<()> {
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(&figures())? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        println!("figures written to {}", path.display());
    }
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
