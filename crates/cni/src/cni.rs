//! Attaching containers to the CNI network: running a network's plugins for ADD, CHECK and DEL
//! as the CNI spec prescribes, the per-container result cache, and the network's readiness.
//!
//! Every attachment is two networks, as in containerd: a built-in loopback network on `lo`, then
//! the network of the config directory on the attachment's interface (normally `eth0`).
//!
//! The cache (`<cache_dir>/<container id>.json`) is written *before* the first plugin runs and
//! holds the network config, interface, namespace, CNI_ARGS and port mappings of the attachment,
//! plus the final ADD result once there is one. DEL runs from it, so it tears down what ADD set up
//! even when the config directory has changed since, and even after a crash in the middle of ADD.
//! The entry is removed only when every plugin's DEL succeeded.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use berth_common::error::error_chain;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::config::{self, ConfigError, NetworkConfigList, PluginConfig};
use crate::exec::{PluginError, PluginRunner, ProcessRunner, find_plugin};
use crate::netns::{self, NetnsError, NetnsOps};
use crate::result::{CniResult, ResultError};

/// Where berth keeps its per-container CNI result cache by default.
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/berth/cni/results";
/// Where CNI plugins are looked for by default: the conventional dir, then Debian's.
pub const DEFAULT_BIN_DIRS: [&str; 2] = ["/opt/cni/bin", "/usr/lib/cni"];
/// The reason of a not-ready network, as kubelet and containerd spell it.
pub const NOT_READY_REASON: &str = "NetworkPluginNotReady";

const LOOPBACK_NETWORK: &str = "cni-loopback";
const LOOPBACK_IFNAME: &str = "lo";
const PORT_MAPPINGS: &str = "portMappings";

/// The three CNI operations berth runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Check,
    Del,
}

impl Command {
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Check => "CHECK",
            Command::Del => "DEL",
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn code_suffix(code: &Option<u64>) -> String {
    code.map(|c| format!(" (code {c})")).unwrap_or_default()
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.is_empty() { String::new() } else { format!("; stderr: {stderr}") }
}

/// Errors of attaching and detaching containers.
#[derive(Debug, thiserror::Error)]
pub enum CniError {
    /// No usable network config; see the source for which and why.
    #[error("loading the CNI network config")]
    Config(#[from] ConfigError),
    /// A plugin the network needs is in none of the plugin directories.
    #[error("CNI plugin {plugin:?} not found in {dirs:?}")]
    PluginNotFound { plugin: String, dirs: Vec<PathBuf> },
    /// A plugin could not be started.
    #[error("starting CNI plugin {plugin:?} for {command}")]
    PluginExec {
        plugin: String,
        command: Command,
        #[source]
        source: io::Error,
    },
    /// A plugin ran and reported failure.
    #[error("CNI plugin {plugin:?} {command} failed{}: {msg}{}", code_suffix(.code), stderr_suffix(.stderr))]
    PluginFailed { plugin: String, command: Command, code: Option<u64>, msg: String, stderr: String },
    /// A plugin succeeded but printed something that is not a CNI result.
    #[error("CNI plugin {plugin:?} {command} printed an unusable result")]
    InvalidResult {
        plugin: String,
        command: Command,
        #[source]
        source: ResultError,
    },
    /// The attachment itself is malformed.
    #[error("invalid CNI attachment: {reason}")]
    InvalidAttachment { reason: String },
    /// CHECK needs a completed ADD, and there is none for this container.
    #[error("container {container_id:?} is not attached to the CNI network")]
    NotAttached { container_id: String },
    /// The result cache could not be read or written.
    #[error("CNI result cache {path:?}")]
    Cache {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The sandbox's network namespace could not be created or deleted.
    #[error("sandbox network namespace")]
    Netns(#[from] NetnsError),
}

/// One port of the host forwarded to a port of the container (portmap's `portMappings`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    pub host_port: u16,
    pub container_port: u16,
    /// `tcp`, `udp` or `sctp` (lower case, as portmap expects).
    pub protocol: String,
    /// The host address to listen on; `None` for all of them.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "hostIP")]
    pub host_ip: Option<String>,
}

impl PortMapping {
    pub fn tcp(host_port: u16, container_port: u16) -> Self {
        Self { host_port, container_port, protocol: "tcp".into(), host_ip: None }
    }
}

/// A container (in practice a pod sandbox) to attach to the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// The sandbox ID: CNI_CONTAINERID and the cache key.
    pub container_id: String,
    /// The network namespace to configure.
    pub netns_path: PathBuf,
    /// The interface to create in the namespace.
    pub ifname: String,
    /// CNI_ARGS, in order.
    pub args: Vec<(String, String)>,
    pub port_mappings: Vec<PortMapping>,
}

impl Attachment {
    /// An attachment of `container_id` on `eth0` in `netns_path`, without args or ports.
    pub fn new(container_id: impl Into<String>, netns_path: impl Into<PathBuf>) -> Self {
        Self {
            container_id: container_id.into(),
            netns_path: netns_path.into(),
            ifname: "eth0".into(),
            args: Vec::new(),
            port_mappings: Vec::new(),
        }
    }

    /// Adds the Kubernetes pod args (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`, `K8S_POD_UID`, and the
    /// container ID as `K8S_POD_INFRA_CONTAINER_ID`) that kubelet-era plugins read.
    pub fn with_pod(mut self, namespace: &str, name: &str, uid: &str) -> Self {
        self.args.extend([
            ("K8S_POD_NAMESPACE".to_owned(), namespace.to_owned()),
            ("K8S_POD_NAME".to_owned(), name.to_owned()),
            ("K8S_POD_INFRA_CONTAINER_ID".to_owned(), self.container_id.clone()),
            ("K8S_POD_UID".to_owned(), uid.to_owned()),
        ]);
        self
    }

    pub fn with_port_mappings(mut self, port_mappings: Vec<PortMapping>) -> Self {
        self.port_mappings = port_mappings;
        self
    }

    fn validate(&self) -> Result<(), CniError> {
        let invalid = |reason: String| Err(CniError::InvalidAttachment { reason });
        if !valid_container_id(&self.container_id) {
            return invalid(format!("container ID {:?} must match [a-zA-Z0-9][a-zA-Z0-9_.-]*", self.container_id));
        }
        let ifname_ok = !self.ifname.is_empty()
            && self.ifname.len() <= 15
            && !matches!(self.ifname.as_str(), "." | "..")
            && !self.ifname.contains(|c: char| c == '/' || c == ':' || c.is_whitespace());
        if !ifname_ok {
            return invalid(format!("interface name {:?} is not a valid Linux interface name", self.ifname));
        }
        for (key, value) in &self.args {
            if key.is_empty() || key.contains([';', '=']) || value.contains(';') {
                return invalid(format!("CNI_ARGS entry {key:?}={value:?} cannot be encoded"));
            }
        }
        Ok(())
    }
}

/// The CNI spec's container ID rule, which also makes it a safe cache file name.
fn valid_container_id(id: &str) -> bool {
    let mut chars = id.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// `IgnoreUnknown=1;K=V;...`: the first entry keeps strict plugins (host-local) from refusing keys
/// they do not know.
fn encode_args(args: &[(String, String)]) -> String {
    if args.is_empty() {
        return String::new();
    }
    let mut out = String::from("IgnoreUnknown=1");
    for (key, value) in args {
        out.push_str(&format!(";{key}={value}"));
    }
    out
}

/// Whether the network is usable, for CRI's `NetworkReady` condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkStatus {
    pub ready: bool,
    /// Empty when ready, else [`NOT_READY_REASON`].
    pub reason: String,
    /// Empty when ready, else what is missing.
    pub message: String,
    /// The name of the network that would be used, when a config is loaded.
    pub network: Option<String>,
}

/// A sandbox's network namespace, attached.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxNetwork {
    pub netns_path: PathBuf,
    pub result: CniResult,
}

/// What the cache keeps per container.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CacheEntry {
    container_id: String,
    netns: PathBuf,
    ifname: String,
    args: Vec<(String, String)>,
    port_mappings: Vec<PortMapping>,
    /// Whether the loopback network was part of the attachment.
    loopback: bool,
    /// The network config list exactly as ADD ran it.
    network: Value,
    /// The final ADD result; `None` while (or if interrupted during) ADD.
    result: Option<Value>,
}

/// The fixed part of one plugin invocation.
struct Invocation<'a> {
    command: Command,
    container_id: &'a str,
    /// Empty on DEL when the namespace is already gone.
    netns: &'a str,
    ifname: &'a str,
    cni_args: &'a str,
    port_mappings: &'a [PortMapping],
}

/// The CNI network of one config directory, with its plugin directories and result cache.
///
/// All methods block on plugin processes; async callers run them under `spawn_blocking`. Calls
/// for different containers may run concurrently; calls for one container must not overlap.
pub struct Cni {
    conf_dir: PathBuf,
    bin_dirs: Vec<PathBuf>,
    cache_dir: PathBuf,
    loopback: bool,
    runner: Arc<dyn PluginRunner>,
}

impl fmt::Debug for Cni {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cni")
            .field("conf_dir", &self.conf_dir)
            .field("bin_dirs", &self.bin_dirs)
            .field("cache_dir", &self.cache_dir)
            .field("loopback", &self.loopback)
            .finish_non_exhaustive()
    }
}

impl Cni {
    /// The network configured in `conf_dir`, with plugins from `bin_dirs` (searched in order).
    ///
    /// The config is read on every ADD and status, so a config dropped in later is picked up.
    pub fn new(conf_dir: impl Into<PathBuf>, bin_dirs: Vec<PathBuf>) -> Self {
        Self {
            conf_dir: conf_dir.into(),
            bin_dirs,
            cache_dir: PathBuf::from(DEFAULT_CACHE_DIR),
            loopback: true,
            runner: Arc::new(ProcessRunner),
        }
    }

    /// Keeps the result cache in `dir` instead of [`DEFAULT_CACHE_DIR`].
    pub fn with_cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = dir.into();
        self
    }

    /// Runs plugins through `runner` instead of as child processes.
    pub fn with_runner(mut self, runner: Arc<dyn PluginRunner>) -> Self {
        self.runner = runner;
        self
    }

    /// Does not run the built-in loopback network (for networks that bring up `lo` themselves).
    pub fn without_loopback(mut self) -> Self {
        self.loopback = false;
        self
    }

    pub fn conf_dir(&self) -> &Path {
        &self.conf_dir
    }

    pub fn bin_dirs(&self) -> &[PathBuf] {
        &self.bin_dirs
    }

    /// The network config that the next ADD would use.
    pub fn network(&self) -> Result<NetworkConfigList, CniError> {
        Ok(config::load(&self.conf_dir)?)
    }

    /// Ready when a config loads and every plugin it needs (and loopback) is installed.
    pub fn status(&self) -> NetworkStatus {
        let checked = self.network().and_then(|list| {
            self.resolve(&list)?;
            if self.loopback {
                self.resolve(&loopback_network())?;
            }
            Ok(list)
        });
        match checked {
            Ok(list) => {
                NetworkStatus { ready: true, reason: String::new(), message: String::new(), network: Some(list.name) }
            }
            Err(error) => NetworkStatus {
                ready: false,
                reason: NOT_READY_REASON.to_owned(),
                message: error_chain(&error),
                network: self.network().ok().map(|list| list.name),
            },
        }
    }

    /// Attaches the container: loopback on `lo` and, at the same time, the configured network on
    /// its interface (the two touch different interfaces; each plugin exec costs milliseconds).
    ///
    /// On failure every plugin's DEL is run (in reverse order, also for plugins that did not get
    /// to run, as the spec asks), and the error names the plugin that failed.
    pub fn add(&self, attachment: &Attachment) -> Result<CniResult, CniError> {
        attachment.validate()?;
        let list = self.network()?;
        let loopback = self.loopback.then(loopback_network);
        // Every binary is looked up before anything runs: a missing plugin changes nothing.
        let binaries = self.resolve(&list)?;
        let loopback_binaries = loopback.as_ref().map(|lo| self.resolve(lo)).transpose()?;

        let mut entry = CacheEntry {
            container_id: attachment.container_id.clone(),
            netns: attachment.netns_path.clone(),
            ifname: attachment.ifname.clone(),
            args: attachment.args.clone(),
            port_mappings: attachment.port_mappings.clone(),
            loopback: loopback.is_some(),
            network: list.to_json(),
            result: None,
        };
        self.write_cache(&entry)?;

        let cni_args = encode_args(&attachment.args);
        let netns = attachment.netns_path.to_string_lossy();
        let invocation = |ifname| Invocation {
            command: Command::Add,
            container_id: &attachment.container_id,
            netns: &netns,
            ifname,
            cni_args: &cni_args,
            port_mappings: &attachment.port_mappings,
        };

        let mut last = None;
        let outcome = std::thread::scope(|scope| {
            let lo = loopback.as_ref().zip(loopback_binaries.as_ref()).map(|(lo, bins)| {
                let lo_invocation = invocation(LOOPBACK_IFNAME);
                scope.spawn(move || self.run_add(&lo_invocation, lo, bins, &mut None))
            });
            let network = self.run_add(&invocation(&attachment.ifname), &list, &binaries, &mut last);
            let lo = lo.map_or(Ok(()), |h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
            lo.and(network)
        });
        let parsed = outcome.and_then(|()| {
            let (plugin, raw) = last.clone().ok_or_else(|| CniError::InvalidResult {
                plugin: list.plugins.last().map(|p| p.plugin_type.clone()).unwrap_or_default(),
                command: Command::Add,
                source: ResultError::Missing,
            })?;
            CniResult::from_json(raw).map_err(|source| CniError::InvalidResult {
                plugin,
                command: Command::Add,
                source,
            })
        });
        let result = match parsed {
            Ok(result) => result,
            Err(error) => {
                tracing::warn!(container_id = %attachment.container_id, error = %error_chain(&error), "CNI ADD failed, undoing");
                entry.result = last.map(|(_, raw)| raw);
                if let Err(undo) = self.del_entry(&entry) {
                    tracing::warn!(container_id = %attachment.container_id, error = %error_chain(&undo), "undoing a failed CNI ADD failed; the cache entry is kept for a later DEL");
                }
                return Err(error);
            }
        };
        entry.result = Some(result.raw.clone());
        self.write_cache(&entry)?;
        tracing::debug!(container_id = %attachment.container_id, network = %list.name, pod_ip = ?result.pod_ip(), "CNI ADD done");
        Ok(result)
    }

    /// Checks that the container's attachment is still as ADD left it.
    ///
    /// Skipped (Ok) for networks with `disableCheck` or a cniVersion before 0.4.0. Plugins that
    /// declare `portMappings` get none: portmap 1.1.1's CHECK also looks for an ip6tables chain and
    /// fails for IPv4-only containers that have port mappings (containernetworking/plugins#819),
    /// so port mappings are not checked. The loopback network is not checked either.
    pub fn check(&self, attachment: &Attachment) -> Result<(), CniError> {
        attachment.validate()?;
        let not_attached = || CniError::NotAttached { container_id: attachment.container_id.clone() };
        let entry = self.read_cache(&attachment.container_id)?.ok_or_else(not_attached)?;
        let result = entry.result.clone().ok_or_else(not_attached)?;
        let list = NetworkConfigList::from_json(entry.network.clone(), &self.cache_path(&entry.container_id))?;
        if list.disable_check || version_tuple(&list.cni_version) < (0, 4, 0) {
            return Ok(());
        }
        let binaries = self.resolve(&list)?;
        let cni_args = encode_args(&entry.args);
        let netns = entry.netns.to_string_lossy();
        let invocation = Invocation {
            command: Command::Check,
            container_id: &entry.container_id,
            netns: &netns,
            ifname: &entry.ifname,
            cni_args: &cni_args,
            port_mappings: &[],
        };
        for (plugin, binary) in list.plugins.iter().zip(&binaries) {
            self.exec(&invocation, &list, plugin, binary, Some(&result))?;
        }
        Ok(())
    }

    /// Detaches the container: DEL of the network in reverse plugin order, then of loopback.
    ///
    /// Runs from the cache entry ADD wrote when there is one (the config, interface, namespace and
    /// port mappings of that ADD, its result as `prevResult`), else from the current config and
    /// `attachment`. Idempotent: a second DEL, or a DEL after the namespace is gone, succeeds.
    /// The namespace should still exist, though: the bridge plugin finds the addresses whose
    /// masquerade rules it removes on the interface inside it.
    pub fn del(&self, attachment: &Attachment) -> Result<(), CniError> {
        attachment.validate()?;
        let entry = match self.read_cache(&attachment.container_id)? {
            Some(entry) => entry,
            None => {
                let list = match self.network() {
                    Ok(list) => list,
                    Err(CniError::Config(ConfigError::ConfigNotFound { .. })) => {
                        tracing::debug!(container_id = %attachment.container_id, "CNI DEL without a cache entry or config: nothing to do");
                        return Ok(());
                    }
                    Err(error) => return Err(error),
                };
                let mut port_mappings = attachment.port_mappings.clone();
                // Unknown whether ADD mapped ports; portmap removes a container's rules only when
                // DEL carries at least one mapping (any will do).
                if port_mappings.is_empty() && list.plugins.iter().any(|p| p.capabilities.contains(PORT_MAPPINGS)) {
                    port_mappings.push(PortMapping::tcp(1, 1));
                }
                CacheEntry {
                    container_id: attachment.container_id.clone(),
                    netns: attachment.netns_path.clone(),
                    ifname: attachment.ifname.clone(),
                    args: attachment.args.clone(),
                    port_mappings,
                    loopback: self.loopback,
                    network: list.to_json(),
                    result: None,
                }
            }
        };
        self.del_entry(&entry)
    }

    /// The cached ADD result of a container, if it has one.
    pub fn cached_result(&self, container_id: &str) -> Result<Option<CniResult>, CniError> {
        let Some(raw) = self.read_cache(container_id)?.and_then(|entry| entry.result) else {
            return Ok(None);
        };
        let result = CniResult::from_json(raw).map_err(|source| CniError::Cache {
            path: self.cache_path(container_id),
            source: io::Error::new(io::ErrorKind::InvalidData, source),
        })?;
        Ok(Some(result))
    }

    /// Creates a network namespace named after the container and attaches it.
    ///
    /// `attachment.netns_path` is replaced by the new namespace's path. When ADD fails, the
    /// namespace is deleted again (ADD has already undone its own work).
    pub fn setup_sandbox(&self, netns: &dyn NetnsOps, mut attachment: Attachment) -> Result<SandboxNetwork, CniError> {
        attachment.validate()?;
        attachment.netns_path = netns.create(&attachment.container_id)?;
        match self.add(&attachment) {
            Ok(result) => Ok(SandboxNetwork { netns_path: attachment.netns_path, result }),
            Err(error) => {
                if let Err(undo) = netns.delete(&attachment.container_id) {
                    tracing::warn!(container_id = %attachment.container_id, error = %undo, "deleting the namespace of a failed CNI ADD failed");
                }
                Err(error)
            }
        }
    }

    /// Detaches the container, then deletes its namespace; idempotent.
    ///
    /// When DEL fails the namespace is kept, so that a retry can still clean up inside it.
    pub fn teardown_sandbox(&self, netns: &dyn NetnsOps, attachment: &Attachment) -> Result<(), CniError> {
        self.del(attachment)?;
        netns.delete(&attachment.container_id)?;
        Ok(())
    }

    /// Runs DEL for every plugin of the entry's networks (the network's in reverse order, and
    /// loopback's at the same time), then drops the entry.
    fn del_entry(&self, entry: &CacheEntry) -> Result<(), CniError> {
        let list = NetworkConfigList::from_json(entry.network.clone(), &self.cache_path(&entry.container_id))?;
        let binaries = self.resolve(&list)?;
        let cni_args = encode_args(&entry.args);
        // A namespace that is gone is passed as empty: plugins then skip work inside it.
        let netns = if netns::is_netns_mount(&entry.netns) { entry.netns.to_string_lossy() } else { "".into() };
        let invocation = |ifname| Invocation {
            command: Command::Del,
            container_id: &entry.container_id,
            netns: &netns,
            ifname,
            cni_args: &cni_args,
            port_mappings: &entry.port_mappings,
        };
        // Every plugin gets its DEL even when an earlier one failed; the first error is returned.
        let (network_error, lo_error) = std::thread::scope(|scope| {
            let lo = entry.loopback.then(|| {
                let lo_invocation = invocation(LOOPBACK_IFNAME);
                scope.spawn(move || {
                    let lo = loopback_network();
                    self.resolve(&lo).and_then(|bins| self.exec(&lo_invocation, &lo, &lo.plugins[0], &bins[0], None))
                })
            });
            let mut first_error = None;
            let main = invocation(&entry.ifname);
            for (plugin, binary) in list.plugins.iter().zip(&binaries).rev() {
                if let Err(error) = self.exec(&main, &list, plugin, binary, entry.result.as_ref()) {
                    first_error.get_or_insert(error);
                }
            }
            let lo = lo.map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
            (first_error, lo.and_then(Result::err))
        });
        if let Some(error) = network_error.or(lo_error) {
            return Err(error);
        }
        self.remove_cache(&entry.container_id)?;
        tracing::debug!(container_id = %entry.container_id, network = %list.name, "CNI DEL done");
        Ok(())
    }

    /// ADD through the list in order, chaining each result into the next plugin's `prevResult`.
    /// `last` is the latest result and the plugin that printed it.
    fn run_add(
        &self,
        invocation: &Invocation<'_>,
        list: &NetworkConfigList,
        binaries: &[PathBuf],
        last: &mut Option<(String, Value)>,
    ) -> Result<(), CniError> {
        for (plugin, binary) in list.plugins.iter().zip(binaries) {
            let prev = last.as_ref().map(|(_, raw)| raw);
            if let Some(result) = self.exec(invocation, list, plugin, binary, prev)? {
                *last = Some((plugin.plugin_type.clone(), result));
            }
        }
        Ok(())
    }

    /// Runs one plugin; returns its result for ADD (`None` if it printed nothing).
    fn exec(
        &self,
        invocation: &Invocation<'_>,
        list: &NetworkConfigList,
        plugin: &PluginConfig,
        binary: &Path,
        prev: Option<&Value>,
    ) -> Result<Option<Value>, CniError> {
        let command = invocation.command;
        let env = self.plugin_env(invocation);
        let stdin = plugin_stdin(list, plugin, prev, invocation.port_mappings);
        let stdin = serde_json::to_vec(&stdin).expect("a JSON value serializes");
        let plugin_type = &plugin.plugin_type;
        tracing::trace!(plugin = %plugin_type, %command, container_id = %invocation.container_id, "running CNI plugin");
        let output = self.runner.run(binary, &env, &stdin).map_err(|source| CniError::PluginExec {
            plugin: plugin_type.clone(),
            command,
            source,
        })?;
        if !output.success() {
            let error = PluginError::from_output(&output);
            return Err(CniError::PluginFailed {
                plugin: plugin_type.clone(),
                command,
                code: error.code,
                msg: error.message(),
                stderr: truncate(String::from_utf8_lossy(&output.stderr).trim(), 4096),
            });
        }
        if command != Command::Add || output.stdout.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let result = serde_json::from_slice(&output.stdout).map_err(|source| CniError::InvalidResult {
            plugin: plugin_type.clone(),
            command,
            source: ResultError::Shape(source),
        })?;
        Ok(Some(result))
    }

    fn plugin_env(&self, invocation: &Invocation<'_>) -> Vec<(String, String)> {
        let cni_path = self.bin_dirs.iter().map(|d| d.to_string_lossy()).collect::<Vec<_>>().join(":");
        [
            ("CNI_COMMAND", invocation.command.as_str()),
            ("CNI_CONTAINERID", invocation.container_id),
            ("CNI_NETNS", invocation.netns),
            ("CNI_IFNAME", invocation.ifname),
            ("CNI_ARGS", invocation.cni_args),
            ("CNI_PATH", &cni_path),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    /// The binary of every plugin of the list, in order.
    fn resolve(&self, list: &NetworkConfigList) -> Result<Vec<PathBuf>, CniError> {
        list.plugins
            .iter()
            .map(|plugin| {
                find_plugin(&plugin.plugin_type, &self.bin_dirs).ok_or_else(|| CniError::PluginNotFound {
                    plugin: plugin.plugin_type.clone(),
                    dirs: self.bin_dirs.clone(),
                })
            })
            .collect()
    }

    fn cache_path(&self, container_id: &str) -> PathBuf {
        self.cache_dir.join(format!("{container_id}.json"))
    }

    fn read_cache(&self, container_id: &str) -> Result<Option<CacheEntry>, CniError> {
        let path = self.cache_path(container_id);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(CniError::Cache { path, source }),
        };
        let entry = serde_json::from_slice(&bytes).map_err(|e| CniError::Cache { path, source: e.into() })?;
        Ok(Some(entry))
    }

    /// Writes the entry atomically (aside, then renamed over the old one).
    fn write_cache(&self, entry: &CacheEntry) -> Result<(), CniError> {
        let path = self.cache_path(&entry.container_id);
        let cache_err = |source| CniError::Cache { path: path.clone(), source };
        std::fs::create_dir_all(&self.cache_dir).map_err(cache_err)?;
        let tmp = self.cache_dir.join(format!(".{}.tmp", entry.container_id));
        let bytes = serde_json::to_vec(entry).map_err(|e| cache_err(e.into()))?;
        std::fs::write(&tmp, bytes).map_err(cache_err)?;
        std::fs::rename(&tmp, &path).map_err(cache_err)
    }

    fn remove_cache(&self, container_id: &str) -> Result<(), CniError> {
        let path = self.cache_path(container_id);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(CniError::Cache { path, source }),
        }
    }
}

/// The built-in network that brings up `lo`.
fn loopback_network() -> NetworkConfigList {
    let plugin = json!({ "cniVersion": "1.0.0", "name": LOOPBACK_NETWORK, "type": "loopback" });
    NetworkConfigList::from_json(plugin, Path::new("<built-in loopback network>"))
        .expect("the built-in loopback network is valid")
}

/// A plugin's stdin: its config with the list's `name` and `cniVersion`, `runtimeConfig` for the
/// capabilities it declares, and `prevResult`.
fn plugin_stdin(list: &NetworkConfigList, plugin: &PluginConfig, prev: Option<&Value>, ports: &[PortMapping]) -> Value {
    let mut config = plugin.raw.clone();
    config.insert("name".into(), Value::String(list.name.clone()));
    config.insert("cniVersion".into(), Value::String(list.cni_version.clone()));
    let mut runtime: BTreeMap<&str, Value> = BTreeMap::new();
    if plugin.capabilities.contains(PORT_MAPPINGS) {
        runtime.insert(PORT_MAPPINGS, serde_json::to_value(ports).expect("port mappings serialize"));
    }
    if !runtime.is_empty() {
        config.insert("runtimeConfig".into(), json!(runtime));
    }
    if let Some(prev) = prev {
        config.insert("prevResult".into(), prev.clone());
    }
    Value::Object(config)
}

fn version_tuple(version: &str) -> (u32, u32, u32) {
    let mut parts = version.split('.').map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::os::unix::fs::PermissionsExt as _;
    use std::sync::Mutex;

    use super::*;
    use crate::exec::PluginOutput;
    use crate::netns::{NetnsCall, RecordingNetns};

    /// One recorded plugin run.
    #[derive(Debug, Clone)]
    struct Call {
        plugin: String,
        env: BTreeMap<String, String>,
        stdin: Value,
    }

    impl Call {
        fn command(&self) -> &str {
            &self.env["CNI_COMMAND"]
        }
    }

    /// Plays the plugins: bridge allocates an address, the others pass `prevResult` on; a plugin
    /// and command named in `fail` fail with a CNI error object.
    #[derive(Default)]
    struct FakeRunner {
        calls: Mutex<Vec<Call>>,
        fail: Option<(&'static str, &'static str)>,
    }

    impl FakeRunner {
        fn failing(plugin: &'static str, command: &'static str) -> Self {
            Self { fail: Some((plugin, command)), ..Self::default() }
        }

        /// Every run, loopback's included.
        fn all_calls(&self) -> Vec<Call> {
            self.calls.lock().unwrap().clone()
        }

        /// The runs of the configured network's plugins: loopback's run beside them, in no
        /// fixed order with them.
        fn calls(&self) -> Vec<Call> {
            self.all_calls().into_iter().filter(|c| c.plugin != "loopback").collect()
        }

        fn loopback_calls(&self) -> Vec<Call> {
            self.all_calls().into_iter().filter(|c| c.plugin == "loopback").collect()
        }

        fn order(&self) -> Vec<String> {
            self.calls().iter().map(|c| format!("{} {}", c.command(), c.plugin)).collect()
        }

        fn loopback_order(&self) -> Vec<String> {
            self.loopback_calls().iter().map(|c| c.command().to_string()).collect()
        }

        fn clear(&self) {
            self.calls.lock().unwrap().clear();
        }
    }

    fn bridge_result(netns: &str) -> Value {
        json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "br0"}, {"name": "eth0", "sandbox": netns}],
            "ips": [{"interface": 1, "address": "10.77.0.2/24", "gateway": "10.77.0.1"}],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {}
        })
    }

    impl PluginRunner for FakeRunner {
        fn run(&self, binary: &Path, env: &[(String, String)], stdin: &[u8]) -> io::Result<PluginOutput> {
            let call = Call {
                plugin: binary.file_name().unwrap().to_string_lossy().into_owned(),
                env: env.iter().cloned().collect(),
                stdin: serde_json::from_slice(stdin).unwrap(),
            };
            self.calls.lock().unwrap().push(call.clone());
            if self.fail == Some((call.plugin.as_str(), call.command())) {
                let error = json!({"cniVersion": "1.0.0", "code": 7, "msg": "boom", "details": "no luck"});
                let stderr = b"plugin trace".to_vec();
                return Ok(PluginOutput { code: Some(1), stdout: error.to_string().into_bytes(), stderr });
            }
            let stdout = match (call.command(), call.plugin.as_str()) {
                ("ADD", "bridge") => bridge_result(&call.env["CNI_NETNS"]).to_string(),
                ("ADD", _) => {
                    call.stdin.get("prevResult").cloned().unwrap_or(json!({"cniVersion": "1.0.0"})).to_string()
                }
                _ => String::new(),
            };
            Ok(PluginOutput { code: Some(0), stdout: stdout.into_bytes(), stderr: Vec::new() })
        }
    }

    /// A config dir, a bin dir with (empty, executable) plugins, a cache dir.
    struct Fixture {
        dir: tempfile::TempDir,
        runner: Arc<FakeRunner>,
        cni: Cni,
    }

    const CONFLIST: &str = r#"{"cniVersion":"1.0.0","name":"testnet","plugins":[
        {"type":"bridge","bridge":"br0","ipam":{"type":"host-local"}},
        {"type":"portmap","capabilities":{"portMappings":true}}]}"#;

    fn fixture_with(runner: FakeRunner, conflist: Option<&str>) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let (conf, bin) = (dir.path().join("net.d"), dir.path().join("bin"));
        std::fs::create_dir_all(&conf).unwrap();
        std::fs::create_dir_all(&bin).unwrap();
        for plugin in ["bridge", "portmap", "loopback", "host-local"] {
            std::fs::write(bin.join(plugin), "").unwrap();
            std::fs::set_permissions(bin.join(plugin), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        if let Some(conflist) = conflist {
            std::fs::write(conf.join("10-test.conflist"), conflist).unwrap();
        }
        let runner = Arc::new(runner);
        let cni = Cni::new(conf, vec![dir.path().join("empty"), bin])
            .with_cache_dir(dir.path().join("cache"))
            .with_runner(runner.clone());
        Fixture { dir, runner, cni }
    }

    fn fixture() -> Fixture {
        fixture_with(FakeRunner::default(), Some(CONFLIST))
    }

    impl Fixture {
        fn cache_file(&self, id: &str) -> PathBuf {
            self.dir.path().join("cache").join(format!("{id}.json"))
        }

        /// An attachment whose namespace path exists as a directory (the fake does not care).
        fn attachment(&self, id: &str) -> Attachment {
            Attachment::new(id, self.dir.path().join("ns"))
                .with_pod("default", "web", "uid-1")
                .with_port_mappings(vec![PortMapping::tcp(18080, 8080)])
        }
    }

    #[test]
    fn add_runs_loopback_on_lo_beside_the_plugins_in_order_with_the_cni_environment() {
        let f = fixture();
        f.cni.add(&f.attachment("pod1")).unwrap();
        assert_eq!(f.runner.order(), ["ADD bridge", "ADD portmap"]);
        assert_eq!(f.runner.loopback_order(), ["ADD"]);
        assert_eq!(f.runner.loopback_calls()[0].env["CNI_IFNAME"], "lo");
        let calls = f.runner.calls();
        let env = &calls[0].env;
        assert_eq!(env["CNI_IFNAME"], "eth0");
        assert_eq!(env["CNI_CONTAINERID"], "pod1");
        assert_eq!(env["CNI_NETNS"], f.dir.path().join("ns").to_string_lossy());
        assert_eq!(
            env["CNI_ARGS"],
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=pod1;K8S_POD_UID=uid-1"
        );
        let bins = f.cni.bin_dirs().iter().map(|d| d.to_string_lossy()).collect::<Vec<_>>().join(":");
        assert_eq!(env["CNI_PATH"], bins);
        assert_eq!(env.keys().filter(|k| k.starts_with("CNI_")).count(), 6);
    }

    #[test]
    fn plugins_get_name_version_declared_runtime_config_and_the_previous_result_on_stdin() {
        let f = fixture();
        f.cni.add(&f.attachment("pod1")).unwrap();
        let calls = f.runner.calls();
        let lo = &f.runner.loopback_calls()[0].stdin;
        let (bridge, portmap) = (&calls[0].stdin, &calls[1].stdin);
        assert_eq!((&lo["name"], &lo["type"]), (&json!("cni-loopback"), &json!("loopback")));
        assert_eq!((&bridge["name"], &bridge["cniVersion"]), (&json!("testnet"), &json!("1.0.0")));
        assert_eq!(bridge["bridge"], "br0");
        assert!(bridge.get("prevResult").is_none() && bridge.get("runtimeConfig").is_none());
        assert_eq!(
            portmap["runtimeConfig"],
            json!({"portMappings": [{"hostPort": 18080, "containerPort": 8080, "protocol": "tcp"}]})
        );
        assert_eq!(portmap["prevResult"], bridge_result(&calls[0].env["CNI_NETNS"]));
    }

    #[test]
    fn the_final_result_is_parsed_and_cached() {
        let f = fixture();
        let result = f.cni.add(&f.attachment("pod1")).unwrap();
        assert_eq!(result.pod_ip(), Some("10.77.0.2".parse().unwrap()));
        assert_eq!(result.ips[0].gateway, Some("10.77.0.1".parse().unwrap()));
        assert!(f.cache_file("pod1").exists());
        assert_eq!(f.cni.cached_result("pod1").unwrap(), Some(result));
        assert_eq!(f.cni.cached_result("other").unwrap(), None);
    }

    #[test]
    fn del_runs_in_reverse_with_the_cached_result_and_mappings_and_drops_the_cache() {
        let f = fixture();
        let added = f.cni.add(&f.attachment("pod1")).unwrap();
        f.runner.clear();
        // The caller no longer knows the ports or the args: the cache does.
        f.cni.del(&Attachment::new("pod1", f.dir.path().join("ns"))).unwrap();
        assert_eq!(f.runner.order(), ["DEL portmap", "DEL bridge"]);
        assert_eq!(f.runner.loopback_order(), ["DEL"]);
        let calls = f.runner.calls();
        assert_eq!(calls[0].stdin["prevResult"], added.raw);
        assert_eq!(calls[1].stdin["prevResult"], added.raw);
        assert_eq!(calls[0].stdin["runtimeConfig"]["portMappings"][0]["hostPort"], 18080);
        assert!(calls[0].env["CNI_ARGS"].contains("K8S_POD_NAME=web"));
        assert!(!f.cache_file("pod1").exists());
    }

    #[test]
    fn del_runs_the_config_that_add_ran_even_after_the_config_changed() {
        let f = fixture();
        f.cni.add(&f.attachment("pod1")).unwrap();
        let other = CONFLIST
            .replace("testnet", "othernet")
            .replace(",\n        {\"type\":\"portmap\",\"capabilities\":{\"portMappings\":true}}", "");
        std::fs::write(f.cni.conf_dir().join("00-other.conflist"), other).unwrap();
        assert_eq!(f.cni.network().unwrap().name, "othernet");
        f.runner.clear();
        f.cni.del(&f.attachment("pod1")).unwrap();
        assert_eq!(f.runner.order(), ["DEL portmap", "DEL bridge"]);
        assert_eq!(f.runner.loopback_order(), ["DEL"]);
        assert_eq!(f.runner.calls()[0].stdin["name"], "testnet");
    }

    #[test]
    fn del_without_a_cache_entry_runs_the_current_config_with_a_placeholder_port_mapping() {
        let f = fixture();
        f.cni.del(&Attachment::new("pod1", "/nonexistent/ns")).unwrap();
        f.cni.del(&Attachment::new("pod1", "/nonexistent/ns")).unwrap();
        assert_eq!(f.runner.order().len(), 4, "each DEL runs every plugin");
        assert_eq!(f.runner.loopback_order(), ["DEL", "DEL"]);
        let portmap = &f.runner.calls()[0];
        assert_eq!(portmap.plugin, "portmap");
        assert_eq!(portmap.stdin["runtimeConfig"]["portMappings"].as_array().unwrap().len(), 1);
        assert!(portmap.stdin.get("prevResult").is_none());
    }

    #[test]
    fn del_passes_an_empty_netns_when_the_namespace_is_gone() {
        let f = fixture();
        f.cni.add(&Attachment::new("pod1", "/nonexistent/ns")).unwrap();
        f.runner.clear();
        f.cni.del(&Attachment::new("pod1", "/nonexistent/ns")).unwrap();
        assert!(f.runner.all_calls().iter().all(|c| c.env["CNI_NETNS"].is_empty()));
    }

    #[test]
    fn del_without_a_cache_entry_or_config_does_nothing() {
        let f = fixture_with(FakeRunner::default(), None);
        f.cni.del(&Attachment::new("pod1", "/nonexistent/ns")).unwrap();
        assert!(f.runner.all_calls().is_empty());
    }

    #[test]
    fn a_failing_del_still_runs_the_other_plugins_and_keeps_the_cache_for_a_retry() {
        let f = fixture_with(FakeRunner::failing("portmap", "DEL"), Some(CONFLIST));
        f.cni.add(&f.attachment("pod1")).unwrap();
        f.runner.clear();
        let err = f.cni.del(&f.attachment("pod1")).unwrap_err();
        assert!(matches!(&err, CniError::PluginFailed { plugin, command: Command::Del, .. } if plugin == "portmap"));
        assert_eq!(f.runner.order(), ["DEL portmap", "DEL bridge"]);
        assert_eq!(f.runner.loopback_order(), ["DEL"]);
        assert!(f.cache_file("pod1").exists());
    }

    #[test]
    fn a_failing_plugin_undoes_the_add_and_the_error_names_it_with_its_message_and_stderr() {
        let f = fixture_with(FakeRunner::failing("portmap", "ADD"), Some(CONFLIST));
        let err = f.cni.add(&f.attachment("pod1")).unwrap_err();
        match &err {
            CniError::PluginFailed { plugin, command, code, msg, stderr } => {
                assert_eq!((plugin.as_str(), *command, *code), ("portmap", Command::Add, Some(7)));
                assert_eq!((msg.as_str(), stderr.as_str()), ("boom: no luck", "plugin trace"));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(err.to_string(), "CNI plugin \"portmap\" ADD failed (code 7): boom: no luck; stderr: plugin trace");
        assert_eq!(f.runner.order(), ["ADD bridge", "ADD portmap", "DEL portmap", "DEL bridge"]);
        assert_eq!(f.runner.loopback_order(), ["ADD", "DEL"]);
        // The undo knows what bridge allocated.
        let calls = f.runner.calls();
        assert_eq!(calls[2].stdin["prevResult"], bridge_result(&calls[0].env["CNI_NETNS"]));
        assert!(!f.cache_file("pod1").exists());
    }

    #[test]
    fn a_missing_plugin_fails_the_add_before_anything_runs() {
        let conflist = CONFLIST.replace("portmap", "nosuchplugin");
        let f = fixture_with(FakeRunner::default(), Some(&conflist));
        let err = f.cni.add(&f.attachment("pod1")).unwrap_err();
        assert!(
            matches!(&err, CniError::PluginNotFound { plugin, dirs } if plugin == "nosuchplugin" && dirs.len() == 2)
        );
        assert!(f.runner.all_calls().is_empty());
        assert!(!f.cache_file("pod1").exists());
    }

    #[test]
    fn check_runs_the_network_without_port_mappings_against_the_cached_result() {
        let f = fixture();
        let err = f.cni.check(&f.attachment("pod1")).unwrap_err();
        assert!(matches!(err, CniError::NotAttached { .. }));
        let added = f.cni.add(&f.attachment("pod1")).unwrap();
        f.runner.clear();
        f.cni.check(&f.attachment("pod1")).unwrap();
        assert_eq!(f.runner.order(), ["CHECK bridge", "CHECK portmap"]);
        let portmap = &f.runner.calls()[1].stdin;
        assert_eq!(portmap["runtimeConfig"]["portMappings"], json!([]));
        assert_eq!(portmap["prevResult"], added.raw);
    }

    #[test]
    fn check_is_skipped_for_networks_that_predate_it_or_disable_it() {
        for conflist in [
            CONFLIST.replace("1.0.0", "0.3.1"),
            CONFLIST.replace("{\"cniVersion\"", "{\"disableCheck\":true,\"cniVersion\""),
        ] {
            let f = fixture_with(FakeRunner::default(), Some(&conflist));
            f.cni.add(&f.attachment("pod1")).unwrap();
            f.runner.clear();
            f.cni.check(&f.attachment("pod1")).unwrap();
            assert!(f.runner.all_calls().is_empty(), "{conflist}");
        }
    }

    #[test]
    fn status_names_what_is_missing() {
        let f = fixture_with(FakeRunner::default(), None);
        let status = f.cni.status();
        assert!(!status.ready);
        assert_eq!(status.reason, NOT_READY_REASON);
        assert!(status.message.contains("no CNI network config"), "{}", status.message);

        std::fs::write(f.cni.conf_dir().join("10.conflist"), CONFLIST.replace("portmap", "nosuchplugin")).unwrap();
        let status = f.cni.status();
        assert!(!status.ready && status.message.contains("\"nosuchplugin\" not found"), "{}", status.message);
        assert_eq!(status.network.as_deref(), Some("testnet"));

        std::fs::write(f.cni.conf_dir().join("10.conflist"), CONFLIST).unwrap();
        let status = f.cni.status();
        assert!(status.ready, "{status:?}");
        assert_eq!((status.reason.as_str(), status.message.as_str()), ("", ""));
    }

    #[test]
    fn malformed_attachments_are_rejected_before_anything_runs() {
        let f = fixture();
        let mut bad_args = f.attachment("pod1");
        bad_args.args.push(("X".into(), "a;b".into()));
        let mut bad_ifname = f.attachment("pod1");
        bad_ifname.ifname = "eth0/../x".into();
        for attachment in [f.attachment("../etc"), f.attachment(""), bad_args, bad_ifname] {
            let err = f.cni.add(&attachment).unwrap_err();
            assert!(matches!(err, CniError::InvalidAttachment { .. }), "{attachment:?}");
        }
        assert!(f.runner.all_calls().is_empty());
    }

    #[test]
    fn a_sandbox_gets_a_namespace_named_after_it_and_loses_it_after_detaching() {
        let f = fixture();
        let netns = RecordingNetns::new("/run/fake-netns");
        let network = f.cni.setup_sandbox(&netns, Attachment::new("pod1", "")).unwrap();
        assert_eq!(network.netns_path, PathBuf::from("/run/fake-netns/pod1"));
        assert_eq!(f.runner.calls()[0].env["CNI_NETNS"], "/run/fake-netns/pod1");
        f.cni.teardown_sandbox(&netns, &Attachment::new("pod1", "/run/fake-netns/pod1")).unwrap();
        f.cni.teardown_sandbox(&netns, &Attachment::new("pod1", "/run/fake-netns/pod1")).unwrap();
        let create = NetnsCall::Create("pod1".into());
        let delete = NetnsCall::Delete("pod1".into());
        assert_eq!(netns.calls(), [create, delete.clone(), delete]);
        assert!(!netns.exists("pod1"));
    }

    #[test]
    fn a_sandbox_whose_add_fails_loses_its_namespace_again() {
        let f = fixture_with(FakeRunner::failing("bridge", "ADD"), Some(CONFLIST));
        let netns = RecordingNetns::new("/run/fake-netns");
        let err = f.cni.setup_sandbox(&netns, Attachment::new("pod1", "")).unwrap_err();
        assert!(matches!(err, CniError::PluginFailed { .. }));
        assert_eq!(netns.calls(), [NetnsCall::Create("pod1".into()), NetnsCall::Delete("pod1".into())]);
    }

    #[test]
    fn a_sandbox_whose_namespace_cannot_be_created_runs_no_plugin() {
        let f = fixture();
        let netns = RecordingNetns::failing_create("/run/fake-netns");
        let err = f.cni.setup_sandbox(&netns, Attachment::new("pod1", "")).unwrap_err();
        assert!(matches!(err, CniError::Netns(NetnsError::Kernel { .. })));
        assert!(f.runner.all_calls().is_empty());
    }

    #[test]
    fn a_sandbox_whose_del_fails_keeps_its_namespace_for_a_retry() {
        let f = fixture_with(FakeRunner::failing("bridge", "DEL"), Some(CONFLIST));
        let netns = RecordingNetns::new("/run/fake-netns");
        f.cni.setup_sandbox(&netns, Attachment::new("pod1", "")).unwrap();
        assert!(f.cni.teardown_sandbox(&netns, &Attachment::new("pod1", "/run/fake-netns/pod1")).is_err());
        assert!(netns.exists("pod1"));
    }
}
