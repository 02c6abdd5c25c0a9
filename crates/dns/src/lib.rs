//! Cluster DNS answered by berth: Service, endpoint and pod names from API watches, other names relayed.
//!
//! The crate is a pure index ([`Records`], answers as [`Answer`]) inside a thin shell: two
//! watches keep the index current, and one UDP and one TCP listener on the same address answer
//! from it. In-zone answers carry TTL 5 and NXDOMAIN/NODATA carry the zone's SOA, as CoreDNS's
//! `kubernetes` plugin does. Until both watches have listed once, in-zone questions get SERVFAIL
//! rather than answers clients would cache wrongly.

mod forward;
mod message;
pub mod records;
mod server;
mod watch;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use tokio::net::{TcpListener, UdpSocket};
use tokio::task::JoinSet;

pub use forward::UPSTREAM_TIMEOUT;
pub use records::{Answer, Records, TTL};

/// The default cluster domain.
pub const DEFAULT_ZONE: &str = "cluster.local";

/// Where and what to serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// UDP and TCP are both served here; port 0 picks a free port for both.
    pub listen: SocketAddr,
    /// The cluster domain, e.g. `cluster.local`.
    pub zone: String,
    /// Resolvers for every other name, tried in order. They must not lead back to this server.
    pub upstreams: Vec<SocketAddr>,
}

impl Config {
    /// A config for the default zone.
    pub fn new(listen: SocketAddr, upstreams: Vec<SocketAddr>) -> Config {
        Config { listen, zone: DEFAULT_ZONE.to_string(), upstreams }
    }
}

/// Why the DNS server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("invalid dns zone {zone:?}")]
    Zone {
        zone: String,
        #[source]
        source: hickory_proto::ProtoError,
    },
    #[error("binding dns listener on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("dns task {task} stopped")]
    Stopped { task: &'static str },
}

/// A running cluster DNS server. Dropping it stops the listeners and the watches.
#[derive(Debug)]
pub struct ClusterDns {
    local_addr: SocketAddr,
    shared: Arc<watch::Shared>,
    tasks: JoinSet<&'static str>,
    /// Task names by id, to name a task that panicked.
    names: HashMap<tokio::task::Id, &'static str>,
}

impl ClusterDns {
    /// Binds UDP and TCP on `config.listen` and starts the watches; returns once bound, before
    /// the first list (see [`ClusterDns::synced`]).
    pub async fn start(client: kube::Client, config: Config) -> Result<ClusterDns, DnsError> {
        let records =
            Records::new(&config.zone).map_err(|source| DnsError::Zone { zone: config.zone.clone(), source })?;
        let (udp, tcp) = bind(config.listen).await?;
        let local_addr = udp.local_addr().map_err(|source| DnsError::Bind { addr: config.listen, source })?;
        let (synced, _) = tokio::sync::watch::channel(watch::Synced::default());
        let shared = Arc::new(watch::Shared { records: RwLock::new(records), synced });
        let ctx = server::Context::new(shared.clone(), config.upstreams);

        let mut tasks = JoinSet::new();
        let mut names = HashMap::new();
        let mut spawn = |name: &'static str, task: Pin<Box<dyn Future<Output = ()> + Send>>| {
            let handle = tasks.spawn(async move {
                task.await;
                name
            });
            names.insert(handle.id(), name);
        };
        spawn("udp listener", Box::pin(server::serve_udp(udp, ctx.clone())));
        spawn("tcp listener", Box::pin(server::serve_tcp(tcp, ctx)));
        spawn("service watch", Box::pin(watch::follow::<Service>(client.clone(), shared.clone())));
        spawn("endpointslice watch", Box::pin(watch::follow::<EndpointSlice>(client, shared.clone())));
        Ok(ClusterDns { local_addr, shared, tasks, names })
    }

    /// The bound address, UDP and TCP alike.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Resolves once both watches have delivered their first full list.
    pub async fn synced(&self) {
        let mut rx = self.shared.synced.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(watch::Synced::all).await;
    }

    /// Serves until a listener or watch stops, which only a panic does, so it returns only
    /// errors; cancel it by dropping the future. Callers that only need the server in the
    /// background can keep the `ClusterDns` alive instead: its tasks run from
    /// [`ClusterDns::start`] on.
    pub async fn run(mut self) -> Result<Infallible, DnsError> {
        let task = match self.tasks.join_next_with_id().await {
            Some(Ok((_, task))) => task,
            Some(Err(e)) => {
                tracing::error!(error = %e, "dns task failed");
                self.names.get(&e.id()).copied().unwrap_or("unknown")
            }
            None => "none",
        };
        Err(DnsError::Stopped { task })
    }
}

/// Binds UDP then TCP on the same port. With port 0 the TCP side may find the UDP port taken,
/// so a few fresh ports are tried.
async fn bind(listen: SocketAddr) -> Result<(UdpSocket, TcpListener), DnsError> {
    let attempts = if listen.port() == 0 { 8 } else { 1 };
    let mut last = None;
    for _ in 0..attempts {
        let udp = UdpSocket::bind(listen).await.map_err(|source| DnsError::Bind { addr: listen, source })?;
        let addr = udp.local_addr().map_err(|source| DnsError::Bind { addr: listen, source })?;
        match TcpListener::bind(addr).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(source) => last = Some(DnsError::Bind { addr, source }),
        }
    }
    Err(last.unwrap_or(DnsError::Bind { addr: listen, source: std::io::Error::other("no attempt made") }))
}

/// The nameservers of a `resolv.conf`, on port 53, in file order.
pub fn nameservers(resolv_conf: &str) -> Vec<SocketAddr> {
    resolv_conf
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == "nameserver").then(|| words.next())?
        })
        // A zone index ("fe80::1%eth0") cannot be expressed in a SocketAddr; such entries are skipped.
        .filter_map(|ip| ip.parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::nameservers;

    #[test]
    fn nameservers_are_read_from_resolv_conf_in_order_on_port_53() {
        let conf = "# comment\nsearch example.com\nnameserver 10.0.0.2\nnameserver  fd00::53\n\
                    nameserver fe80::1%eth0\noptions ndots:5\n";
        let got: Vec<String> = nameservers(conf).iter().map(|a| a.to_string()).collect();
        assert_eq!(got, vec!["10.0.0.2:53", "[fd00::53]:53"]);
    }
}
