//! The `berth` binary: one subcommand per part of the orchestrator.

mod commands;
mod memory;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "berth",
    version,
    about = "Kubernetes-compatible orchestrator where every pod runs on the runtime its RuntimeClass names"
)]
struct Cli {
    /// Set by `berth up`'s supervisor on the parts it starts: the part gets SIGTERM when the
    /// supervisor dies, and exits at once if it is already gone.
    #[arg(long, hide = true, value_name = "PID")]
    supervisor_pid: Option<u32>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a whole cluster on this machine (server, runtime with the OCI runtimes that work here, agent), or join one as a worker.
    Up(commands::up::Args),
    /// Stop the cluster `berth up` started; containers keep running unless --stop-pods.
    Down(commands::down::Args),
    /// Show each part of the cluster `berth up` runs: state, pid, health, the node's handlers, logs.
    Status(commands::status::Args),
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
    // `berth up`, `down` and `status` talk to the user; only the supervisor keeps a log (its
    // readiness polls make kube's client log every refused connection: it reports its own).
    let default_log = match &cli.command {
        Command::Up(args) if args.runs_supervisor() => "info,kube_client=off",
        Command::Up(_) | Command::Down(_) | Command::Status(_) => "error,kube_client=off",
        _ => "info",
    };
    init_logging(default_log);
    if let Some(pid) = cli.supervisor_pid {
        die_with_supervisor(pid);
    }
    // `berth up`'s supervisor starts its parts from this thread, so that the kernel's
    // parent-death signal (tied to the thread that forked) fires only when the process ends.
    let mut builder = if matches!(cli.command, Command::Up(_) | Command::Down(_) | Command::Status(_)) {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    if matches!(cli.command, Command::Runtime(_)) {
        // The CRI runtime idles most of its life: blocking threads (OCI runtime calls, record
        // writes) go as soon as a burst is over instead of keeping their memory for 10 s.
        builder.thread_keep_alive(std::time::Duration::from_secs(1)).max_blocking_threads(64);
        memory::limit_arenas();
    }
    if matches!(cli.command, Command::Agent(_)) {
        memory::limit_arenas();
    }
    // A large list's memory goes back to the OS once it is written.
    berth_apiserver::memory::set_trim(memory::trim);
    let runtime = builder.enable_all().build()?;
    runtime.block_on(async {
        match cli.command {
            Command::Up(args) => commands::up::run(args).await,
            Command::Down(args) => commands::down::run(args).await,
            Command::Status(args) => commands::status::run(args).await,
            Command::Server(args) => commands::server::run(args).await,
            Command::Runtime(args) => commands::runtime::run(args).await,
            Command::Cri(args) => commands::cri::run(args).await,
            Command::Agent(args) => commands::agent::run(args).await,
            Command::Scheduler(args) => commands::scheduler::run(args).await,
            Command::ControllerManager(args) => commands::controller_manager::run(args).await,
        }
    })
}

/// SIGTERM when the supervisor `pid` (our parent) dies; exit now if it already has.
fn die_with_supervisor(pid: u32) {
    use rustix::process::{Signal, getppid, set_parent_process_death_signal};
    if let Err(e) = set_parent_process_death_signal(Some(Signal::TERM)) {
        tracing::warn!(error = %e, "cannot ask for a signal when the supervisor dies");
    }
    if getppid().map(|p| p.as_raw_nonzero().get() as u32) != Some(pid) {
        eprintln!("berth: the supervisor (pid {pid}) is gone; exiting");
        std::process::exit(1);
    }
}

fn init_logging(default: &str) {
    use std::io::IsTerminal as _;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("BERTH_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let json = std::env::var("BERTH_LOG_FORMAT").is_ok_and(|f| f == "json");
    // Colours only on a terminal: the parts `berth up` starts log to files.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
