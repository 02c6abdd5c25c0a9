//! The `berth` binary: one subcommand per part of the orchestrator.

mod commands;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "berth",
    version,
    about = "Kubernetes-compatible orchestrator where every pod runs on the runtime its RuntimeClass names"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the Kubernetes API (control plane) on the embedded store or etcd.
    Server(commands::server::Args),
    /// Serve CRI (pods, containers and images per runtime handler) on a unix socket for runc, crun and gVisor.
    Runtime(commands::runtime::Args),
    /// Place pending pods on nodes (RuntimeClass-aware), against any Kubernetes API server.
    Scheduler(commands::scheduler::Args),
    /// Run the controllers (ReplicaSet, Deployment, garbage collector, node lifecycle, namespace) against any Kubernetes API server.
    ControllerManager(commands::controller_manager::Args),
    /// Run the node agent: register this node and run the pods bound to it through its CRI runtimes.
    Agent(commands::agent::Args),
    /// Talk to a CRI runtime, as crictl does: runp, create, start, ps, pods, logs, exec, attach, port-forward, stop, rm, stats, pull, images, ...
    Cri(commands::cri::Args),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if matches!(cli.command, Command::Runtime(_)) {
        // The CRI runtime idles most of its life: blocking threads (OCI runtime calls, record
        // writes) go as soon as a burst is over instead of keeping their memory for 10 s.
        builder.thread_keep_alive(std::time::Duration::from_secs(1)).max_blocking_threads(64);
        berth_runtime::memory::limit_arenas();
    }
    if matches!(cli.command, Command::Agent(_)) {
        berth_runtime::memory::limit_arenas();
    }
    let runtime = builder.enable_all().build()?;
    runtime.block_on(async {
        match cli.command {
            Command::Server(args) => commands::server::run(args).await,
            Command::Runtime(args) => commands::runtime::run(args).await,
            Command::Cri(args) => commands::cri::run(args).await,
            Command::Agent(args) => commands::agent::run(args).await,
            Command::Scheduler(args) => commands::scheduler::run(args).await,
            Command::ControllerManager(args) => commands::controller_manager::run(args).await,
        }
    })
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("BERTH_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("BERTH_LOG_FORMAT").is_ok_and(|f| f == "json");
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
