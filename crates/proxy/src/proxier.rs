//! The proxy's loop: watches Services, EndpointSlices and its own Node, and after each burst of
//! changes applies one transaction holding only what changed for the Services touched, as a
//! netlink batch ([`crate::netlink`]). The whole table is (re)built through `nft`, as is a change
//! of the node's pod range. Nothing is applied before both lists are complete, so a restart never
//! rejects a Service that still has endpoints. A failed transaction makes the next one rebuild
//! the whole table.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use tokio::time::Instant;

use crate::command::Command;
use crate::conntrack;
use crate::model::{ServiceKey, service_ports};
use crate::netlink::Netlink;
use crate::rules::{NodeNetwork, ServiceRules, service_rules};
use crate::sync::Applied;
use crate::table::{Table, document};

/// How long changes are gathered before one transaction applies them.
pub const DEFAULT_BATCH_DELAY: Duration = Duration::from_millis(20);
/// The longest wait before retrying a failed transaction.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);

/// The proxy's settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// The node whose endpoints count as local, and whose `spec.podCIDR` tells its pods' traffic
    /// from outside traffic.
    pub node_name: String,
    /// The nftables table (family `ip`) the proxy owns.
    pub table: String,
    /// The `nft` binary, for the whole table (changes go to the kernel through netlink, in the
    /// proxy's own network namespace).
    pub nft: PathBuf,
    /// The `conntrack` binary, which deletes UDP flows to endpoints that are gone.
    pub conntrack: PathBuf,
    pub batch_delay: Duration,
    /// Every node's pods (kube-proxy's `--cluster-cidr`): what pods send elsewhere is masqueraded.
    pub cluster_cidr: Option<(Ipv4Addr, u8)>,
}

impl Config {
    pub fn new(node_name: impl Into<String>) -> Config {
        Config {
            node_name: node_name.into(),
            table: "berth".into(),
            nft: PathBuf::from("nft"),
            conntrack: PathBuf::from("conntrack"),
            batch_delay: DEFAULT_BATCH_DELAY,
            cluster_cidr: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("cannot run {program}: {source}")]
    Exec { program: String, source: std::io::Error },
    #[error("{program} refused the transaction: {stderr}")]
    Refused { program: String, stderr: String },
    #[error("netlink: cannot {action}: {source}")]
    Netlink { action: &'static str, source: nix::errno::Errno },
    #[error("the kernel refused the transaction at `{command}`: {errno} ({})", errno.desc())]
    Kernel { command: String, errno: nix::errno::Errno },
    #[error(transparent)]
    Unsupported(#[from] crate::netlink::expr::Unsupported),
}

/// Runs `commands` as one `nft -j -f -` transaction.
pub async fn apply(nft: &std::path::Path, commands: Vec<Value>) -> Result<(), ProxyError> {
    let payload = document(commands).to_string();
    let program = nft.display().to_string();
    nftables::helper::apply_ruleset_raw_async(&payload, Some(nft), std::iter::empty::<&str>())
        .await
        .map(|_| ())
        .map_err(|e| match e {
            nftables::helper::NftablesError::NftFailed { stderr, stdout, .. } => {
                let said = if stderr.trim().is_empty() { stdout } else { stderr };
                ProxyError::Refused { program, stderr: said.trim().to_string() }
            }
            nftables::helper::NftablesError::NftExecution { inner, .. } => ProxyError::Exec { program, source: inner },
            other => ProxyError::Refused { program, stderr: other.to_string() },
        })
}

/// Removes the proxy's table and every rule in it (nothing happens when there is none).
pub async fn remove_table(nft: &std::path::Path, table: &str) -> Result<(), ProxyError> {
    apply(nft, Table::new(table).remove()).await
}

// Each update is moved once, from the watch to the state; boxing would only add allocations.
#[allow(clippy::large_enum_variant)]
enum Update {
    Service(Event<Service>),
    Slice(Event<EndpointSlice>),
    Node(Event<Node>),
}

/// What the watches have shown so far.
#[derive(Default)]
struct State {
    services: HashMap<ServiceKey, Service>,
    /// Slices by (namespace, name), with the Service each belonged to when last seen.
    slices: HashMap<(String, String), (Option<ServiceKey>, EndpointSlice)>,
    by_service: HashMap<ServiceKey, BTreeSet<(String, String)>>,
    net: NodeNetwork,
    dirty: BTreeSet<ServiceKey>,
    /// Keys listed since the current relist began, per kind.
    relisted_services: Option<BTreeSet<ServiceKey>>,
    relisted_slices: Option<BTreeSet<(String, String)>>,
    services_listed: bool,
    slices_listed: bool,
}

fn slice_key(slice: &EndpointSlice) -> (String, String) {
    (slice.metadata.namespace.clone().unwrap_or_default(), slice.metadata.name.clone().unwrap_or_default())
}

impl State {
    fn ready(&self) -> bool {
        self.services_listed && self.slices_listed
    }

    fn put_service(&mut self, svc: Service) {
        let key = ServiceKey::of(&svc);
        self.dirty.insert(key.clone());
        self.services.insert(key, svc);
    }

    fn drop_service(&mut self, key: &ServiceKey) {
        self.dirty.insert(key.clone());
        self.services.remove(key);
    }

    fn put_slice(&mut self, slice: EndpointSlice) {
        let key = slice_key(&slice);
        let owner = ServiceKey::of_slice(&slice);
        self.drop_slice(&key);
        if let Some(owner) = &owner {
            self.by_service.entry(owner.clone()).or_default().insert(key.clone());
            self.dirty.insert(owner.clone());
        }
        self.slices.insert(key, (owner, slice));
    }

    fn drop_slice(&mut self, key: &(String, String)) {
        if let Some((Some(owner), _)) = self.slices.remove(key) {
            if let Some(keys) = self.by_service.get_mut(&owner) {
                keys.remove(key);
                if keys.is_empty() {
                    self.by_service.remove(&owner);
                }
            }
            self.dirty.insert(owner);
        }
    }

    fn apply(&mut self, update: Update, node_name: &str) {
        match update {
            Update::Service(Event::Init) => self.relisted_services = Some(BTreeSet::new()),
            Update::Service(Event::InitApply(svc)) => {
                if let Some(seen) = &mut self.relisted_services {
                    seen.insert(ServiceKey::of(&svc));
                }
                self.put_service(svc);
            }
            Update::Service(Event::InitDone) => {
                let seen = self.relisted_services.take().unwrap_or_default();
                let gone: Vec<_> = self.services.keys().filter(|k| !seen.contains(*k)).cloned().collect();
                gone.iter().for_each(|k| self.drop_service(k));
                self.services_listed = true;
            }
            Update::Service(Event::Apply(svc)) => self.put_service(svc),
            Update::Service(Event::Delete(svc)) => self.drop_service(&ServiceKey::of(&svc)),
            Update::Slice(Event::Init) => self.relisted_slices = Some(BTreeSet::new()),
            Update::Slice(Event::InitApply(slice)) => {
                if let Some(seen) = &mut self.relisted_slices {
                    seen.insert(slice_key(&slice));
                }
                self.put_slice(slice);
            }
            Update::Slice(Event::InitDone) => {
                let seen = self.relisted_slices.take().unwrap_or_default();
                let gone: Vec<_> = self.slices.keys().filter(|k| !seen.contains(*k)).cloned().collect();
                gone.iter().for_each(|k| self.drop_slice(k));
                self.slices_listed = true;
            }
            Update::Slice(Event::Apply(slice)) => self.put_slice(slice),
            Update::Slice(Event::Delete(slice)) => self.drop_slice(&slice_key(&slice)),
            Update::Node(event) => {
                let (Event::Apply(node) | Event::InitApply(node)) = event else { return };
                if node.metadata.name.as_deref() != Some(node_name) {
                    return;
                }
                let net = NodeNetwork {
                    pod_cidr: node.spec.as_ref().and_then(|s| s.pod_cidr.as_deref()).and_then(parse_cidr),
                    ..self.net
                };
                if net != self.net {
                    tracing::info!(pod_cidr = ?net.pod_cidr, "service proxy: the node's pod range changed");
                    self.net = net;
                    self.dirty.extend(self.services.keys().cloned());
                }
            }
        }
    }

    fn rules_of(&self, key: &ServiceKey, node_name: &str) -> Option<ServiceRules> {
        let svc = self.services.get(key)?;
        let slices = self.by_service.get(key).into_iter().flatten().filter_map(|k| self.slices.get(k)).map(|(_, s)| s);
        let ports = service_ports(svc, slices, node_name);
        (!ports.is_empty()).then(|| service_rules(&ports, self.net))
    }
}

/// `10.244.1.0/24` as an address and prefix length (IPv4 only).
pub fn parse_cidr(text: &str) -> Option<(Ipv4Addr, u8)> {
    let (addr, len) = text.split_once('/')?;
    let len: u8 = len.parse().ok().filter(|l| *l <= 32)?;
    Some((addr.parse().ok()?, len))
}

/// Keeps the table in step with the cluster's Services until the future is dropped.
pub async fn run(client: kube::Client, config: Config) {
    let services = watcher::watcher(Api::<Service>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .map(|e| e.map(Update::Service));
    let slices = watcher::watcher(Api::<EndpointSlice>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .map(|e| e.map(Update::Slice));
    let node_selector = watcher::Config::default().fields(&format!("metadata.name={}", config.node_name));
    let nodes =
        watcher::watcher(Api::<Node>::all(client), node_selector).default_backoff().map(|e| e.map(Update::Node));
    let mut updates = std::pin::pin!(stream::select(stream::select(services, slices), nodes));

    let table = Table::new(config.table.clone());
    let mut state =
        State { net: NodeNetwork { pod_cidr: None, cluster_cidr: config.cluster_cidr }, ..State::default() };
    let mut applied: Option<Applied> = None;
    let mut socket: Option<Netlink> = None;
    let mut due: Option<Instant> = None;
    let mut retry_delay = Duration::from_secs(1);
    loop {
        let wait = async {
            match due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            update = updates.next() => {
                match update {
                    Some(Ok(update)) => state.apply(update, &config.node_name),
                    Some(Err(e)) => tracing::warn!(error = %e, "service proxy: watch failed; retrying"),
                    None => return,
                }
                if due.is_none() && state.ready() && (applied.is_none() || !state.dirty.is_empty()) {
                    due = Some(Instant::now() + config.batch_delay);
                }
            }
            () = wait => {
                due = None;
                let started = Instant::now();
                let (result, count) = sync(&config, &table, &mut state, &mut applied, &mut socket).await;
                match result {
                    Ok(()) => {
                        retry_delay = Duration::from_secs(1);
                        if count > 0 {
                            tracing::debug!(services = count, took_ms = started.elapsed().as_millis() as u64, "service proxy: rules synced");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in = ?retry_delay, "service proxy: applying rules failed; the table will be rebuilt");
                        due = Some(Instant::now() + retry_delay);
                        retry_delay = (retry_delay * 2).min(MAX_RETRY_DELAY);
                    }
                }
            }
        }
    }
}

/// One transaction: the whole table when nothing is known to be applied, else the dirty Services.
async fn sync(
    config: &Config,
    table: &Table,
    state: &mut State,
    applied: &mut Option<Applied>,
    socket: &mut Option<Netlink>,
) -> (Result<(), ProxyError>, usize) {
    let dirty = std::mem::take(&mut state.dirty);
    match applied {
        None => {
            let all: BTreeMap<_, _> = state
                .services
                .keys()
                .filter_map(|k| Some((k.clone(), state.rules_of(k, &config.node_name)?)))
                .collect();
            let count = all.len();
            let (mut cmds, fresh) = Applied::rebuild(table, all);
            cmds.extend(table.pod_egress(state.net));
            let result = apply(&config.nft, cmds).await;
            if result.is_ok() {
                let mut fresh = fresh;
                fresh.set_net(state.net);
                *applied = Some(fresh);
            }
            (result, count)
        }
        Some(current) => {
            let changes: Vec<_> = dirty.iter().map(|k| (k.clone(), state.rules_of(k, &config.node_name))).collect();
            let cmds = current.changes(&changes);
            let net_changed = current.net() != state.net;
            if cmds.is_empty() && !net_changed {
                current.commit(changes);
                return (Ok(()), 0);
            }
            let count = changes.len();
            let stale: Vec<_> =
                changes.iter().flat_map(|(k, new)| conntrack::stale(current.get(k), new.as_ref())).collect();
            let result = if net_changed {
                // Rare: the pod-egress rule is rewritten through nft, with the rest.
                let mut json: Vec<Value> = cmds.iter().map(|c| c.json(table)).collect();
                json.extend(table.pod_egress(state.net));
                apply(&config.nft, json).await
            } else {
                apply_changes(socket, &config.nft, table, cmds).await
            };
            if result.is_ok() {
                current.commit(changes);
                current.set_net(state.net);
                // Only once the rules changed: a packet before that would NAT to the old endpoint again.
                if !stale.is_empty() {
                    let program = config.conntrack.clone();
                    tokio::spawn(async move { conntrack::clear(&program, &stale).await });
                }
            } else {
                *applied = None;
            }
            (result, count)
        }
    }
}

/// Applies incremental `commands` as one netlink batch (through `nft` when one of them has no
/// netlink encoding, or no socket opens). The socket is opened on first use (in the calling
/// thread's network namespace), and again after a failure.
pub async fn apply_changes(
    socket: &mut Option<Netlink>,
    nft: &std::path::Path,
    table: &Table,
    commands: Vec<Command>,
) -> Result<(), ProxyError> {
    let netlink = match socket.take().map_or_else(Netlink::open, Ok) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "service proxy: no netlink socket; the change goes through nft");
            return apply(nft, commands.iter().map(|c| c.json(table)).collect()).await;
        }
    };
    let name = table.name.clone();
    let (netlink, commands, result) = tokio::task::spawn_blocking(move || {
        let mut netlink = netlink;
        let result = netlink.apply(&name, &commands);
        (netlink, commands, result)
    })
    .await
    .expect("the netlink batch does not panic");
    match result {
        Ok(()) => {
            *socket = Some(netlink);
            Ok(())
        }
        Err(ProxyError::Unsupported(e)) => {
            *socket = Some(netlink);
            tracing::debug!(error = %e, "service proxy: change applied through nft");
            apply(nft, commands.iter().map(|c| c.json(table)).collect()).await
        }
        Err(e) => Err(e),
    }
}
