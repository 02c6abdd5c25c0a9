//! `berth status`: each part of the cluster `berth up` runs in a data dir — state, pid,
//! restarts, uptime and health as the part itself reports it — the node's Ready condition and
//! runtime handlers, the runtimes found, and where the logs are. Exits non-zero unless every
//! part is running and healthy and the node is Ready.

use std::path::PathBuf;

/// `println!` that ends the command quietly when stdout is closed (`berth status | head -3`)
/// instead of panicking on the broken pipe.
macro_rules! say {
    () => {
        say!("")
    };
    ($($arg:tt)*) => {
        if std::io::Write::write_fmt(&mut std::io::stdout(), format_args!("{}\n", format_args!($($arg)*))).is_err() {
            std::process::exit(0);
        }
    };
}

use k8s_openapi::api::core::v1::Node;

use super::up::cluster::{self, ready_condition, runtime_handlers};
use super::up::health;
use super::up::layout::{DEFAULT_DATA_DIR, Layout, PartState, PartStatus, State, human_duration, live_supervisor};

#[derive(clap::Args)]
pub struct Args {
    /// The data dir `berth up` ran with.
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
}

/// A part's health: `Ok(detail)` or `Err(reason)`.
type Health = Result<String, String>;

pub async fn run(args: Args) -> anyhow::Result<()> {
    let layout = Layout::new(&args.data_dir)?;
    let supervisor = live_supervisor(&layout);
    let Some(state) = State::read(&layout) else {
        say!(
            "berth is not up in {} (no {}: has `berth up` run here?)",
            layout.data_dir.display(),
            layout.state_file().display()
        );
        std::process::exit(1);
    };
    let Some(pid) = supervisor.filter(|p| *p == state.supervisor_pid && state.running) else {
        say!("berth is down in {} (no supervisor running)", layout.data_dir.display());
        print_parts(&state, &[]);
        print_paths(&layout, &state);
        std::process::exit(1);
    };

    let has = |name: &str| state.parts.iter().any(|p| p.name == name);
    let (server, runtime, agent, node) = tokio::join!(
        async {
            if has("server") {
                Some(health::server_readyz(&layout.admin_kubeconfig()).await.map(|()| "ok (/readyz)".to_string()))
            } else {
                None
            }
        },
        async {
            health::runtime_status(&state.runtime_socket).await.map_err(|e| format!("{e:#}")).and_then(|s| {
                let unready = health::unready_conditions(&s);
                let handlers: Vec<&str> =
                    s.runtime_handlers.iter().map(|h| h.name.as_str()).filter(|n| !n.is_empty()).collect();
                if unready.is_empty() {
                    Ok(format!("ok (CRI Status; handlers {})", handlers.join(", ")))
                } else {
                    Err(format!("not ready: {}", unready.join(", ")))
                }
            })
        },
        async {
            health::agent_healthz(state.agent_port)
                .await
                .map(|()| format!("ok (/healthz on port {})", state.agent_port))
        },
        async {
            let client = cluster::client(&state.kubeconfig).await.ok()?;
            kube::Api::<Node>::all(client).get(&state.node_name).await.ok()
        },
    );
    let mut health: Vec<(&str, Health)> = vec![("runtime", runtime), ("agent", agent.map_err(|e| format!("{e:#}")))];
    if let Some(server) = server {
        health.push(("server", server.map_err(|e| format!("{e:#}"))));
    }

    let since = jiff::Timestamp::now().duration_since(state.started_at).unsigned_abs();
    say!(
        "berth is up in {} (supervisor pid {pid}, up {}{})",
        layout.data_dir.display(),
        human_duration(since),
        if state.join { ", a worker: runtime and agent only" } else { "" }
    );
    say!();
    print_parts(&state, &health);
    say!();

    let mut problems = Vec::new();
    for part in &state.parts {
        if part.state != PartState::Running {
            problems.push(format!("{} is {}", part.name, part.state));
        } else if let Some((_, Err(e))) = health.iter().find(|(n, _)| *n == part.name) {
            problems.push(format!("{} is unhealthy: {e}", part.name));
        }
    }
    match &node {
        Some(node) => {
            let ready = ready_condition(node);
            let ready_text = match ready {
                Some(c) if c.status == "True" => "Ready".to_string(),
                Some(c) => format!(
                    "NotReady ({}: {})",
                    c.reason.as_deref().unwrap_or_default(),
                    c.message.as_deref().unwrap_or_default()
                ),
                None => "NotReady (no Ready condition yet)".to_string(),
            };
            if ready.is_none_or(|c| c.status != "True") {
                problems.push(format!("node {} is {ready_text}", state.node_name));
            }
            say!("node {}: {ready_text}; runtimeHandlers: {}", state.node_name, runtime_handlers(node).join(", "));
        }
        None => {
            problems.push(format!("node {} cannot be read from the API", state.node_name));
            say!("node {}: unknown (the API does not answer)", state.node_name);
        }
    }
    say!("runtimes found by berth up:");
    for probe in &state.runtimes {
        say!("  {}", probe.summary());
    }
    print_paths(&layout, &state);
    if !problems.is_empty() {
        say!();
        say!("berth is not fully up: {}", problems.join("; "));
        std::process::exit(1);
    }
    Ok(())
}

fn print_parts(state: &State, health: &[(&str, Health)]) {
    let now = jiff::Timestamp::now();
    let mut rows = vec![["PART", "STATE", "PID", "RESTARTS", "UPTIME", "HEALTH"].map(String::from)];
    for part in &state.parts {
        let PartStatus { name, state: part_state, pid, restarts, since, last_exit, .. } = part;
        let uptime = match (part_state, since) {
            (PartState::Running, Some(t)) => human_duration(now.duration_since(*t).unsigned_abs()),
            (PartState::Restarting, Some(t)) => format!("in {}", human_duration(t.duration_since(now).unsigned_abs())),
            _ => "-".into(),
        };
        let health = match health.iter().find(|(n, _)| n == name) {
            _ if *part_state != PartState::Running => {
                last_exit.as_ref().map(|e| format!("last exit: {e}")).unwrap_or_else(|| "-".into())
            }
            Some((_, Ok(detail))) => detail.clone(),
            Some((_, Err(e))) => format!("failing: {e}"),
            None => "-".into(),
        };
        rows.push([
            name.clone(),
            part_state.to_string(),
            pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            restarts.to_string(),
            uptime,
            health,
        ]);
    }
    let widths: Vec<usize> = (0..5).map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0)).collect();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i < 5 {
                line.push_str(&format!("{cell:<w$}   ", w = widths[i]));
            } else {
                line.push_str(cell);
            }
        }
        say!("{}", line.trim_end());
    }
}

fn print_paths(layout: &Layout, state: &State) {
    say!("data dir:   {}", layout.data_dir.display());
    say!("kubeconfig: {}", state.kubeconfig.display());
    say!("runtime:    unix://{}", state.runtime_socket.display());
    let logs: Vec<String> = std::iter::once(layout.log("up"))
        .chain(state.parts.iter().map(|p| p.log.clone()))
        .map(|p| p.display().to_string())
        .collect();
    say!("logs:       {}", logs.join(", "));
}
