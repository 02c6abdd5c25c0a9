//! `berth server`: the control plane's API server, and `berth server token create` for node
//! credentials.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use berth_apiserver::admission::{Admission, DefaultTolerationSeconds};
use berth_apiserver::authn::{NODE_TOKEN_FILE, NODE_USER_PREFIX, create_node_token, validate_node_name};
use berth_apiserver::server::{PreparedServer, ServerConfig};
use berth_apiserver::services::{ServiceNetwork, advertise_address, ensure_cluster_dns_service};
use berth_scheduler::metrics::Metrics as SchedulerMetrics;
use berth_scheduler::scheduler::Config as SchedulerConfig;

use super::controller_manager::{ControllerArgs, manage};
use super::leading::shutdown_signal;
use super::scheduler::{SchedulingArgs, schedule};

pub const DEFAULT_DATA_DIR: &str = "/var/lib/berth";

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Manage bearer tokens of the server in a data dir.
    #[command(subcommand)]
    Token(TokenCommand),
}

#[derive(clap::Subcommand)]
enum TokenCommand {
    /// Print a kubeconfig for a node agent: user system:node:NAME in group system:nodes.
    ///
    /// The token is added to <data-dir>/node-tokens.csv, which a running server re-reads:
    /// it works at once, without a restart. Earlier tokens of the node keep working; delete
    /// their lines from that file to revoke them.
    Create(TokenCreateArgs),
}

#[derive(clap::Args)]
struct TokenCreateArgs {
    /// The node's name (a DNS-1123 subdomain), as the agent registers it.
    #[arg(long = "node", value_name = "NAME")]
    node: String,
    /// The server's data dir: where its admin.kubeconfig and node tokens live.
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Where the store, certificates, tokens and admin.kubeconfig live.
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    bind_address: IpAddr,
    /// HTTPS port of the API.
    #[arg(long, default_value_t = 6443)]
    secure_port: u16,
    /// Comma-separated etcd v3 endpoints; without them the embedded SQLite store is used.
    #[arg(long, value_delimiter = ',')]
    etcd_servers: Vec<String>,
    /// Static tokens in Kubernetes' CSV format: token,user,uid,"group1,group2".
    #[arg(long)]
    token_auth_file: Option<PathBuf>,
    /// Extra names or IPs for the serving certificate.
    #[arg(long, value_delimiter = ',')]
    tls_san: Vec<String>,
    /// How often store history older than one interval is compacted, in seconds.
    #[arg(long, default_value_t = 300)]
    compaction_interval_seconds: u64,
    /// tolerationSeconds of the toleration for node.kubernetes.io/not-ready:NoExecute added to
    /// every pod that does not already have such a toleration (DefaultTolerationSeconds).
    #[arg(long, default_value_t = 300)]
    default_not_ready_toleration_seconds: i64,
    /// tolerationSeconds of the toleration for node.kubernetes.io/unreachable:NoExecute added to
    /// every pod that does not already have such a toleration (DefaultTolerationSeconds).
    #[arg(long, default_value_t = 300)]
    default_unreachable_toleration_seconds: i64,
    /// Range of addresses Service cluster IPs are allocated from (IPv4 CIDR).
    #[arg(long, default_value = "10.96.0.0/12", value_parser = berth_apiserver::services::IpRange::parse)]
    service_cluster_ip_range: berth_apiserver::services::IpRange,
    /// Range of ports NodePort and LoadBalancer Services get node ports from, both ends included.
    #[arg(long, default_value = "30000-32767", value_parser = berth_apiserver::services::PortRange::parse)]
    service_node_port_range: berth_apiserver::services::PortRange,
    /// Address the `kubernetes` Service's endpoints point at; default: the bind address, or the
    /// default route's source address when bound to 0.0.0.0.
    #[arg(long)]
    advertise_address: Option<IpAddr>,
    /// Do not run the scheduler in this process (run `berth scheduler` instead, or none).
    #[arg(long)]
    no_scheduler: bool,
    /// Address of the cluster DNS Service (`kube-system/kube-dns`), answered by this server; give
    /// agents the same `--cluster-dns`. Default: the Service range's tenth address (10.96.0.10).
    #[arg(long, value_name = "IP")]
    cluster_dns: Option<std::net::Ipv4Addr>,
    /// The cluster's DNS domain.
    #[arg(long, default_value = berth_dns::DEFAULT_ZONE, value_name = "DOMAIN")]
    cluster_domain: String,
    /// Port (UDP and TCP) the cluster DNS listens on at the advertise address, the kube-dns
    /// Service's target port; 0 turns cluster DNS off.
    #[arg(long, default_value_t = DEFAULT_CLUSTER_DNS_PORT, value_name = "PORT")]
    cluster_dns_port: u16,
    #[command(flatten)]
    service_accounts: super::server_flags::ServiceAccountArgs,
    #[command(flatten)]
    admission_plugins: super::server_flags::AdmissionPluginArgs,
    #[command(flatten)]
    scheduling: SchedulingArgs,
    #[command(flatten)]
    controllers: ControllerArgs,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Some(Command::Token(TokenCommand::Create(create))) => create_token(&create),
        None => run_server(args.serve).await,
    }
}

async fn run_server(args: ServeArgs) -> anyhow::Result<()> {
    let mut cfg = ServerConfig {
        data_dir: args.data_dir,
        bind_address: args.bind_address,
        secure_port: args.secure_port,
        etcd_servers: args.etcd_servers.into_iter().filter(|s| !s.is_empty()).collect(),
        token_auth_file: args.token_auth_file,
        // The kubernetes Service's fully qualified name, for in-cluster clients.
        extra_sans: args
            .tls_san
            .into_iter()
            .chain([format!("kubernetes.default.svc.{}", args.cluster_domain)])
            .collect(),
        compaction_interval: Duration::from_secs(args.compaction_interval_seconds.max(1)),
        admission: Admission::server_defaults(DefaultTolerationSeconds {
            not_ready: args.default_not_ready_toleration_seconds,
            unreachable: args.default_unreachable_toleration_seconds,
        }),
        service_network: ServiceNetwork {
            cluster_ip_range: args.service_cluster_ip_range,
            node_port_range: args.service_node_port_range,
        },
        advertise_address: args.advertise_address,
        service_accounts: args.service_accounts.options(),
    };
    args.admission_plugins.apply(&mut cfg.admission)?;
    let enabled = berth_controllers::enabled(&args.controllers.controllers).map_err(anyhow::Error::msg)?;
    let server = PreparedServer::prepare(&cfg).await.context("berth server failed")?;
    let mut parts = Vec::new();
    if !args.no_scheduler {
        // The scheduler reaches the API in-process, as the admin, through the same handlers,
        // admission and watches as any client; --no-scheduler leaves it to another process.
        let client = kube::Client::new(server.local_service(), "default");
        let config = SchedulerConfig {
            percentage_of_nodes_to_score: args.scheduling.percentage_of_nodes_to_score,
            ..Default::default()
        };
        let metrics = SchedulerMetrics::new(&config.scheduler_name);
        server.state.metrics.register(|registry| metrics.register(registry));
        let scheduling = args.scheduling.clone();
        parts
            .push(tokio::spawn(async move { schedule(client, config, &scheduling, metrics, shutdown_signal()).await }));
    }
    if !enabled.is_empty() {
        // The controllers too (--controllers=-* runs none: use `berth controller-manager`).
        // The root CA publisher hands out the CA `prepare` keeps in the data dir.
        let ca_file = cfg.data_dir.join("pki").join("ca.crt");
        let root_ca = std::fs::read_to_string(&ca_file)
            .with_context(|| format!("cannot read the cluster CA {}", ca_file.display()))?;
        let client = kube::Client::new(server.local_service(), "default");
        // Pod networks per node by default: the single binary is the whole cluster.
        let (config, leader_elect) = (args.controllers.config(Some(root_ca), true)?, args.scheduling.leader_elect);
        parts.push(tokio::spawn(async move { manage(client, config, leader_elect, enabled, shutdown_signal()).await }));
    }
    if args.cluster_dns_port != 0 {
        let ip = args.cluster_dns.unwrap_or_else(|| args.service_cluster_ip_range.nth(9));
        let advertise = cfg.advertise_address.unwrap_or_else(|| advertise_address(cfg.bind_address));
        let client = kube::Client::new(server.local_service(), "default");
        let dns = ClusterDnsArgs { ip, advertise, port: args.cluster_dns_port, zone: args.cluster_domain.clone() };
        parts.push(tokio::spawn(serve_cluster_dns(server.state.clone(), client, dns)));
    }
    let served = server.serve().await.context("berth server failed");
    // The parts saw the same signal: let them give their leases up while the API still answers.
    let _ = tokio::time::timeout(Duration::from_secs(3), wait_for_parts(parts)).await;
    served
}

/// The cluster DNS's default port: not 53, which the host's own resolver may hold.
pub const DEFAULT_CLUSTER_DNS_PORT: u16 = 10053;

struct ClusterDnsArgs {
    ip: std::net::Ipv4Addr,
    advertise: IpAddr,
    port: u16,
    zone: String,
}

/// Serves the cluster DNS and keeps `kube-system/kube-dns` pointing at it. Pods reach it through
/// the Service proxy, so it listens on an address they can route to: the advertise address, or
/// the default route's source address when the API is bound to loopback. A failure is logged and
/// leaves the rest of the server running.
async fn serve_cluster_dns(
    state: std::sync::Arc<berth_apiserver::ApiState>,
    client: kube::Client,
    dns: ClusterDnsArgs,
) {
    let address =
        if dns.advertise.is_loopback() { advertise_address(IpAddr::from([0, 0, 0, 0])) } else { dns.advertise };
    let listen = std::net::SocketAddr::new(address, dns.port);
    let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    // Never relay to ourselves: that would loop.
    let upstreams = berth_dns::nameservers(&resolv).into_iter().filter(|u| *u != listen).collect();
    let config = berth_dns::Config { listen, zone: dns.zone.clone(), upstreams };
    let server = match berth_dns::ClusterDns::start(client, config).await {
        Ok(server) => server,
        Err(e) => {
            tracing::warn!(error = %berth_common::error::error_chain(&e), "cluster DNS not served");
            return;
        }
    };
    tracing::info!(%listen, service_ip = %dns.ip, zone = %dns.zone, "serving cluster DNS");
    let keep = async {
        loop {
            if let Err(e) = ensure_cluster_dns_service(&state, dns.ip, address, dns.port).await {
                tracing::warn!(error = %e.message, "keeping the kube-dns service failed");
            }
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
    };
    tokio::select! {
        Err(e) = server.run() => tracing::warn!(error = %berth_common::error::error_chain(&e), "cluster DNS stopped"),
        () = keep => {}
        () = shutdown_signal() => {}
    }
}

async fn wait_for_parts(parts: Vec<tokio::task::JoinHandle<()>>) {
    for part in parts {
        let _ = part.await;
    }
}

/// Adds a node token and prints a kubeconfig with the admin kubeconfig's cluster and that token.
fn create_token(args: &TokenCreateArgs) -> anyhow::Result<()> {
    print!("{}", node_kubeconfig(&args.data_dir, &args.node)?);
    let user = format!("{NODE_USER_PREFIX}{}", args.node);
    eprintln!("added a token for user {user} to {}", args.data_dir.join(NODE_TOKEN_FILE).display());
    Ok(())
}

/// Adds a node token to the server's data dir and returns a kubeconfig (YAML) with the admin
/// kubeconfig's cluster and that token, for user `system:node:<node>`.
pub fn node_kubeconfig(data_dir: &Path, node: &str) -> anyhow::Result<String> {
    validate_node_name(node)?;
    // Read the cluster first, so a data dir without a server gets no token.
    let cluster = admin_cluster(data_dir)?;
    let token =
        create_node_token(data_dir, node).with_context(|| format!("cannot create a token for node {node:?}"))?;
    let user = format!("{NODE_USER_PREFIX}{node}");
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "berth", "cluster": cluster}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "berth", "context": {"cluster": "berth", "user": user}}],
        "current-context": "berth",
        "preferences": {},
    });
    serde_yaml::to_string(&config).context("cannot render the kubeconfig")
}

/// The `cluster` (server URL and CA) of the admin kubeconfig the server writes on start.
pub fn admin_cluster(data_dir: &Path) -> anyhow::Result<serde_json::Value> {
    let path = data_dir.join("admin.kubeconfig");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!("cannot read {} (has `berth server --data-dir {}` run?)", path.display(), data_dir.display())
    })?;
    let config: serde_json::Value =
        serde_yaml::from_str(&text).with_context(|| format!("cannot parse {}", path.display()))?;
    config
        .pointer("/clusters/0/cluster")
        .filter(|c| c.get("server").is_some_and(serde_json::Value::is_string))
        .cloned()
        .with_context(|| format!("{} names no cluster server", path.display()))
}
