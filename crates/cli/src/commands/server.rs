//! `berth server`: the control plane's API server.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use berth_apiserver::server::{ServerConfig, run as serve};

#[derive(clap::Args)]
pub struct Args {
    /// Where the store, certificates, tokens and admin.kubeconfig live.
    #[arg(long, default_value = "/var/lib/berth")]
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
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let cfg = ServerConfig {
        data_dir: args.data_dir,
        bind_address: args.bind_address,
        secure_port: args.secure_port,
        etcd_servers: args.etcd_servers.into_iter().filter(|s| !s.is_empty()).collect(),
        token_auth_file: args.token_auth_file,
        extra_sans: args.tls_san,
        compaction_interval: Duration::from_secs(args.compaction_interval_seconds.max(1)),
    };
    serve(cfg).await.context("berth server failed")
}
