//! The agent's configuration: flags, the TOML file (re-read on change) and the endpoint list.
//!
//! ```toml
//! node_name = "node-a"
//! kubeconfig = "node-a.kubeconfig"      # relative paths are relative to this file
//! port = 10250
//! partial_readiness = false
//! [[endpoints]]
//! workload_type = "container"
//! name = "berth"
//! endpoint = "unix:///run/berth/runtime.sock"
//! image_endpoint = ""                   # empty: the runtime endpoint
//! [[endpoints]]
//! name = "containerd"
//! endpoint = "unix:///run/containerd/containerd.sock"
//! handlers = ["runc"]                   # for runtimes whose Status lists no handlers
//! ```
//!
//! The file may also set `image_gc_high_threshold`, `image_gc_low_threshold`, `root_dir`,
//! `proxy_mode`, `proxy_table`, `cluster_dns` and `cluster_domain`, as the flags of the same names do. Flags override the file. `--container-runtime-endpoint` takes
//! the seed's `workloadType:name:endpoint;…` list; a bare endpoint (`unix:///run/x.sock`) is one
//! `container` endpoint named [`BARE_ENDPOINT_NAME`]. Without any endpoint the agent uses berth's
//! runtime at [`DEFAULT_ENDPOINT`], named [`DEFAULT_ENDPOINT_NAME`].

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::endpoint::socket_path;

pub const DEFAULT_PORT: u16 = 10250;
pub const DEFAULT_ROOT_DIR: &str = "/var/lib/berth/agent";
/// berth's own runtime, used when no endpoint is configured at all.
pub const DEFAULT_ENDPOINT: &str = "unix:///run/berth/runtime.sock";
pub const DEFAULT_ENDPOINT_NAME: &str = "berth";
/// The name of the endpoint a bare `--container-runtime-endpoint unix:///…` configures.
pub const BARE_ENDPOINT_NAME: &str = "runtime";
/// Seed `002_…`: "the `default` string of runtimeName … is reserved".
pub const RESERVED_NAME: &str = "default";
/// The seed's workload types this agent serves. It also names `vm`, which needs VM handlers
/// that are not in this wave, so it is rejected rather than accepted and never used.
pub const WORKLOAD_TYPES: &[&str] = &["container"];
pub const CONTAINER: &str = "container";
/// kubelet's defaults for `--image-gc-high-threshold` / `--image-gc-low-threshold`.
pub const DEFAULT_IMAGE_GC_HIGH: u8 = 85;
pub const DEFAULT_IMAGE_GC_LOW: u8 = 80;
/// The nftables table the Service proxy owns by default.
pub const DEFAULT_PROXY_TABLE: &str = "berth";
/// kubelet's `--cluster-domain` as every cluster sets it.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// How the agent proxies Services (kube-proxy's `--proxy-mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyMode {
    /// Services as nftables rules in the agent's own table.
    Nftables,
    /// No proxy on this node (another one runs, or none is wanted).
    None,
}

impl std::str::FromStr for ProxyMode {
    type Err = String;
    fn from_str(s: &str) -> Result<ProxyMode, String> {
        match s {
            "nftables" => Ok(ProxyMode::Nftables),
            "none" => Ok(ProxyMode::None),
            other => Err(format!("{other:?} is not a proxy mode (nftables or none)")),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse config file {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: Box<toml::de::Error>,
    },
    /// A value is wrong; `key` names it (`--container-runtime-endpoint item "x"`, `endpoints[1]`).
    #[error("{key}: {reason}")]
    Invalid { key: String, reason: String },
}

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key: key.into(), reason: reason.into() }
}

/// One CRI endpoint as configured.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    #[serde(default = "container")]
    pub workload_type: String,
    pub name: String,
    /// `unix:///path/to/runtime.sock` (or the bare path).
    pub endpoint: String,
    /// The image service's socket; empty means `endpoint`.
    #[serde(default)]
    pub image_endpoint: String,
    /// Handlers served when the runtime's Status lists none (containerd 1.6).
    #[serde(default)]
    pub handlers: Vec<String>,
}

fn container() -> String {
    CONTAINER.to_string()
}

/// What the command line said; `None` is "not given".
#[derive(Clone, Debug, Default)]
pub struct Flags {
    pub config: Option<PathBuf>,
    pub kubeconfig: Option<PathBuf>,
    pub node_name: Option<String>,
    pub container_runtime_endpoint: Option<String>,
    pub image_service_endpoint: Option<String>,
    pub port: Option<u16>,
    pub partial_readiness: Option<bool>,
    pub image_gc_high_threshold: Option<u8>,
    pub image_gc_low_threshold: Option<u8>,
    pub root_dir: Option<PathBuf>,
    pub proxy_mode: Option<ProxyMode>,
    pub proxy_table: Option<String>,
    pub cluster_dns: Option<Vec<String>>,
    pub cluster_domain: Option<String>,
    pub cluster_cidr: Option<String>,
}

/// The config file as written.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub node_name: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    pub port: Option<u16>,
    pub partial_readiness: Option<bool>,
    pub image_gc_high_threshold: Option<u8>,
    pub image_gc_low_threshold: Option<u8>,
    pub root_dir: Option<PathBuf>,
    pub proxy_mode: Option<ProxyMode>,
    pub proxy_table: Option<String>,
    pub cluster_dns: Option<Vec<String>>,
    pub cluster_domain: Option<String>,
    pub cluster_cidr: Option<String>,
    pub endpoints: Option<Vec<EndpointConfig>>,
}

impl FileConfig {
    /// Parses the text of the file at `path`; relative paths in it are taken from `path`'s directory.
    pub fn parse(text: &str, path: &Path) -> Result<FileConfig, ConfigError> {
        let mut file: FileConfig = toml::from_str(text)
            .map_err(|source| ConfigError::Parse { path: path.to_owned(), source: Box::new(source) })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        for p in [&mut file.kubeconfig, &mut file.root_dir].into_iter().flatten() {
            if p.is_relative() {
                *p = dir.join(&*p);
            }
        }
        Ok(file)
    }

    pub fn read(path: &Path) -> Result<(FileConfig, String), ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Ok((FileConfig::parse(&text, path)?, text))
    }
}

/// The validated configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub node_name: String,
    /// The kubeconfig to reach the control plane; `None`: kube's inference (`$KUBECONFIG`,
    /// `~/.kube/config`, in-cluster).
    pub kubeconfig: Option<PathBuf>,
    /// The kubelet API's port (`status.daemonEndpoints.kubeletEndpoint.Port`).
    pub port: u16,
    /// Ready while at least one runtime is ready, instead of all of them (seed `002_…`'s future work).
    pub partial_readiness: bool,
    pub image_gc_high_threshold: u8,
    pub image_gc_low_threshold: u8,
    pub root_dir: PathBuf,
    /// In configured order: the first of a workload type is its default.
    pub endpoints: Vec<EndpointConfig>,
    /// The file re-read on change, if any.
    pub config_file: Option<PathBuf>,
    pub proxy_mode: ProxyMode,
    /// The nftables table (family `ip`) the Service proxy owns; two clusters on one host need two.
    pub proxy_table: String,
    /// The cluster DNS servers pods with `dnsPolicy: ClusterFirst` use (kubelet's `--cluster-dns`);
    /// empty: they use the node's resolver, as kubelet does without the flag.
    pub cluster_dns: Vec<std::net::IpAddr>,
    /// The cluster's DNS domain (kubelet's `--cluster-domain`).
    pub cluster_domain: String,
    /// Every node's pods (kube-proxy's `--cluster-cidr`), as `(network, prefix)`: what pods send
    /// outside it is masqueraded; unknown: what leaves the node's own range is.
    pub cluster_cidr: Option<(std::net::Ipv4Addr, u8)>,
}

impl Config {
    /// Reads the file the flags name (if any) and resolves flags over it.
    pub fn load(flags: &Flags) -> Result<Config, ConfigError> {
        let file = match &flags.config {
            Some(path) => FileConfig::read(path)?.0,
            None => FileConfig::default(),
        };
        Config::resolve(flags, file, &hostname())
    }

    /// Flags over the file over the defaults, validated. `hostname` is the default node name.
    pub fn resolve(flags: &Flags, file: FileConfig, hostname: &str) -> Result<Config, ConfigError> {
        let node_name = match flags.node_name.clone().or(file.node_name) {
            Some(name) => name,
            // kubelet lowercases the hostname it defaults to.
            None => hostname.trim().to_lowercase(),
        };
        if let Some(reason) = dns_subdomain_problem(&node_name) {
            return Err(invalid("node name", format!("{node_name:?} {reason}")));
        }
        let mut endpoints = match (&flags.container_runtime_endpoint, file.endpoints) {
            (Some(list), _) => parse_endpoint_list(list, "--container-runtime-endpoint")?,
            (None, Some(endpoints)) => endpoints,
            (None, None) => vec![EndpointConfig {
                workload_type: CONTAINER.into(),
                name: DEFAULT_ENDPOINT_NAME.into(),
                endpoint: DEFAULT_ENDPOINT.into(),
                image_endpoint: String::new(),
                handlers: Vec::new(),
            }],
        };
        let from_flag = flags.container_runtime_endpoint.is_some();
        validate_endpoints(&endpoints, from_flag)?;
        if let Some(list) = &flags.image_service_endpoint {
            apply_image_endpoints(&mut endpoints, list)?;
        }
        let high = flags.image_gc_high_threshold.or(file.image_gc_high_threshold).unwrap_or(DEFAULT_IMAGE_GC_HIGH);
        let low = flags.image_gc_low_threshold.or(file.image_gc_low_threshold).unwrap_or(DEFAULT_IMAGE_GC_LOW);
        // kubelet's rules and wording for the two thresholds.
        if high > 100 {
            return Err(invalid("--image-gc-high-threshold", format!("{high} must be between 0 and 100, inclusive")));
        }
        if low > 100 {
            return Err(invalid("--image-gc-low-threshold", format!("{low} must be between 0 and 100, inclusive")));
        }
        if low > high {
            return Err(invalid(
                "--image-gc-low-threshold",
                format!("{low} must be less than or equal to --image-gc-high-threshold {high}"),
            ));
        }
        let port = flags.port.or(file.port).unwrap_or(DEFAULT_PORT);
        if port == 0 {
            return Err(invalid("--port", "must be between 1 and 65535"));
        }
        let proxy_table = flags.proxy_table.clone().or(file.proxy_table).unwrap_or_else(|| DEFAULT_PROXY_TABLE.into());
        if proxy_table.is_empty()
            || proxy_table.len() > 64
            || !proxy_table.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(invalid("--proxy-table", format!("{proxy_table:?} must be 1-64 letters, digits, '-' or '_'")));
        }
        let mut cluster_dns = Vec::new();
        for ip in flags.cluster_dns.clone().or(file.cluster_dns).unwrap_or_default() {
            let ip = ip.trim();
            cluster_dns.push(ip.parse().map_err(|_| invalid("--cluster-dns", format!("{ip:?} is not an IP address")))?);
        }
        let cluster_domain =
            flags.cluster_domain.clone().or(file.cluster_domain).unwrap_or_else(|| DEFAULT_CLUSTER_DOMAIN.into());
        let cluster_domain = cluster_domain.trim_end_matches('.').to_string();
        if let Some(reason) = dns_subdomain_problem(&cluster_domain) {
            return Err(invalid("--cluster-domain", format!("{cluster_domain:?} {reason}")));
        }
        let cluster_cidr = match flags.cluster_cidr.clone().or(file.cluster_cidr) {
            None => None,
            Some(text) => Some(parse_ipv4_cidr(&text).ok_or_else(|| {
                invalid("--cluster-cidr", format!("{text:?} is not an IPv4 CIDR (e.g. 10.244.0.0/16)"))
            })?),
        };
        Ok(Config {
            node_name,
            kubeconfig: flags.kubeconfig.clone().or(file.kubeconfig),
            port,
            partial_readiness: flags.partial_readiness.or(file.partial_readiness).unwrap_or(false),
            image_gc_high_threshold: high,
            image_gc_low_threshold: low,
            root_dir: flags.root_dir.clone().or(file.root_dir).unwrap_or_else(|| PathBuf::from(DEFAULT_ROOT_DIR)),
            endpoints,
            config_file: flags.config.clone(),
            proxy_mode: flags.proxy_mode.or(file.proxy_mode).unwrap_or(ProxyMode::Nftables),
            proxy_table,
            cluster_dns,
            cluster_domain,
            cluster_cidr,
        })
    }

    /// Settings that differ from `other` and take effect only after a restart (endpoints,
    /// partial readiness and the image GC thresholds apply at once).
    pub fn needs_restart_for(&self, other: &Config) -> Vec<&'static str> {
        let mut changed = Vec::new();
        if self.node_name != other.node_name {
            changed.push("node_name");
        }
        if self.kubeconfig != other.kubeconfig {
            changed.push("kubeconfig");
        }
        if self.port != other.port {
            changed.push("port");
        }
        if self.root_dir != other.root_dir {
            changed.push("root_dir");
        }
        if self.proxy_mode != other.proxy_mode {
            changed.push("proxy_mode");
        }
        if self.proxy_table != other.proxy_table {
            changed.push("proxy_table");
        }
        if self.cluster_dns != other.cluster_dns {
            changed.push("cluster_dns");
        }
        if self.cluster_domain != other.cluster_domain {
            changed.push("cluster_domain");
        }
        if self.cluster_cidr != other.cluster_cidr {
            changed.push("cluster_cidr");
        }
        changed
    }
}

/// Parses `workloadType:name:endpoint;…`. The endpoint itself contains `:` (`unix:///…`), so
/// each item splits at its first two colons; an item that is itself an endpoint (`unix://…` or
/// `/…`) is one `container` endpoint named [`BARE_ENDPOINT_NAME`]. `flag` names the source in
/// errors.
pub fn parse_endpoint_list(list: &str, flag: &str) -> Result<Vec<EndpointConfig>, ConfigError> {
    let items: Vec<&str> = list.split(';').map(str::trim).filter(|i| !i.is_empty()).collect();
    if items.is_empty() {
        return Err(invalid(flag, "no endpoint given"));
    }
    let mut endpoints = Vec::new();
    for item in items {
        let key = || format!("{flag} item {item:?}");
        if is_bare_endpoint(item) {
            endpoints.push(EndpointConfig {
                workload_type: CONTAINER.into(),
                name: BARE_ENDPOINT_NAME.into(),
                endpoint: item.into(),
                image_endpoint: String::new(),
                handlers: Vec::new(),
            });
            continue;
        }
        let mut parts = item.splitn(3, ':');
        let (Some(workload_type), Some(name), Some(endpoint)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(invalid(
                key(),
                "expected workloadType:name:endpoint, e.g. container:berth:unix:///run/berth/runtime.sock",
            ));
        };
        endpoints.push(EndpointConfig {
            workload_type: workload_type.into(),
            name: name.into(),
            endpoint: endpoint.into(),
            image_endpoint: String::new(),
            handlers: Vec::new(),
        });
    }
    Ok(endpoints)
}

fn is_bare_endpoint(item: &str) -> bool {
    item.starts_with("unix:") || item.starts_with('/')
}

/// Names, workload types and sockets: each name a DNS label other than `default`, used once;
/// each socket used once; only [`WORKLOAD_TYPES`]. Errors name the offending item.
pub fn validate_endpoints(endpoints: &[EndpointConfig], from_flag: bool) -> Result<(), ConfigError> {
    if endpoints.is_empty() {
        return Err(invalid("endpoints", "no CRI endpoint configured"));
    }
    for (i, e) in endpoints.iter().enumerate() {
        let key = if from_flag {
            format!("--container-runtime-endpoint item {:?}", format!("{}:{}:{}", e.workload_type, e.name, e.endpoint))
        } else {
            format!("endpoints[{i}] (name {:?})", e.name)
        };
        if !WORKLOAD_TYPES.contains(&e.workload_type.as_str()) {
            return Err(invalid(
                key,
                format!(
                    "workload type {:?} is not supported (supported: {})",
                    e.workload_type,
                    WORKLOAD_TYPES.join(", ")
                ),
            ));
        }
        if e.name == RESERVED_NAME {
            return Err(invalid(key, format!("the endpoint name {RESERVED_NAME:?} is reserved")));
        }
        if !is_dns_label(&e.name) {
            return Err(invalid(
                key,
                format!(
                    "endpoint name {:?} must be a DNS label (lowercase letters, digits and '-', at most 63)",
                    e.name
                ),
            ));
        }
        if e.endpoint.is_empty() {
            return Err(invalid(key, "the endpoint is empty"));
        }
        socket_path(&e.endpoint).map_err(|err| invalid(key.clone(), err.to_string()))?;
        if !e.image_endpoint.is_empty() {
            socket_path(&e.image_endpoint).map_err(|err| invalid(key.clone(), format!("image endpoint: {err}")))?;
        }
        for (j, h) in e.handlers.iter().enumerate() {
            if !is_dns_label(h) {
                return Err(invalid(key, format!("handlers[{j}] {h:?} is not a DNS label")));
            }
        }
        if let Some(first) = endpoints[..i].iter().find(|o| o.name == e.name) {
            return Err(invalid(
                key,
                format!("endpoint name {:?} is used twice (also for {})", e.name, first.endpoint),
            ));
        }
        let path = socket_path(&e.endpoint).ok();
        if let Some(first) = endpoints[..i].iter().find(|o| socket_path(&o.endpoint).ok() == path) {
            return Err(invalid(key, format!("socket {} is already endpoint {:?}", e.endpoint, first.name)));
        }
    }
    Ok(())
}

/// `--image-service-endpoint`: the same list syntax; each item sets the image endpoint of the
/// runtime endpoint of that name. A bare endpoint is allowed only with a single runtime endpoint.
fn apply_image_endpoints(endpoints: &mut [EndpointConfig], list: &str) -> Result<(), ConfigError> {
    const FLAG: &str = "--image-service-endpoint";
    for item in parse_endpoint_list(list, FLAG)? {
        let key = format!("{FLAG} item {:?}", item.endpoint);
        socket_path(&item.endpoint).map_err(|err| invalid(key.clone(), err.to_string()))?;
        let target = if item.name == BARE_ENDPOINT_NAME && is_bare_endpoint(&item.endpoint) {
            if endpoints.len() != 1 {
                return Err(invalid(
                    key,
                    "a bare image endpoint needs exactly one runtime endpoint; name it as workloadType:name:endpoint",
                ));
            }
            &mut endpoints[0]
        } else {
            let configured: Vec<String> = endpoints.iter().map(|e| e.name.clone()).collect();
            let Some(target) = endpoints.iter_mut().find(|e| e.name == item.name) else {
                return Err(invalid(
                    key,
                    format!("no runtime endpoint is named {:?} (configured: {})", item.name, configured.join(", ")),
                ));
            };
            if target.workload_type != item.workload_type {
                return Err(invalid(
                    key,
                    format!(
                        "endpoint {:?} has workload type {:?}, not {:?}",
                        item.name, target.workload_type, item.workload_type
                    ),
                ));
            }
            target
        };
        target.image_endpoint = item.endpoint;
    }
    Ok(())
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Why `s` is not a DNS subdomain (a Node's name), if it is not.
/// `10.244.0.0/16` with its host bits cleared.
fn parse_ipv4_cidr(text: &str) -> Option<(std::net::Ipv4Addr, u8)> {
    let (addr, len) = text.trim().split_once('/')?;
    let addr: std::net::Ipv4Addr = addr.parse().ok()?;
    let len: u8 = len.parse().ok().filter(|l| *l <= 32)?;
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len)) };
    Some((std::net::Ipv4Addr::from(u32::from(addr) & mask), len))
}

fn dns_subdomain_problem(s: &str) -> Option<&'static str> {
    if s.is_empty() {
        return Some("is empty");
    }
    if s.len() > 253 {
        return Some("is longer than 253 characters");
    }
    let ok = s.split('.').all(|label| {
        !label.is_empty()
            && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    });
    (!ok).then_some("is not a DNS subdomain (lowercase letters, digits, '-' and '.')")
}

/// The machine's hostname (kernel's nodename).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags_with_endpoints(list: &str) -> Flags {
        Flags { container_runtime_endpoint: Some(list.into()), ..Default::default() }
    }

    fn resolve(flags: &Flags) -> Result<Config, ConfigError> {
        Config::resolve(flags, FileConfig::default(), "Node-A")
    }

    fn err(flags: &Flags) -> String {
        resolve(flags).unwrap_err().to_string()
    }

    fn file(text: &str) -> FileConfig {
        FileConfig::parse(text, Path::new("/etc/berth/agent.toml")).unwrap()
    }

    #[test]
    fn an_endpoint_list_splits_each_item_at_its_first_two_colons() {
        let list = "container:berth:unix:///run/berth/runtime.sock;container:containerd:unix:///run/containerd/containerd.sock";
        let endpoints = parse_endpoint_list(list, "--container-runtime-endpoint").unwrap();
        assert_eq!(endpoints.len(), 2);
        assert_eq!(
            (endpoints[0].workload_type.as_str(), endpoints[0].name.as_str(), endpoints[0].endpoint.as_str()),
            ("container", "berth", "unix:///run/berth/runtime.sock")
        );
        assert_eq!(endpoints[1].name, "containerd");
        assert_eq!(endpoints[1].endpoint, "unix:///run/containerd/containerd.sock");
    }

    #[test]
    fn a_bare_endpoint_is_one_container_endpoint_named_runtime() {
        for bare in ["unix:///run/x.sock", "/run/x.sock"] {
            let config = resolve(&flags_with_endpoints(bare)).unwrap();
            assert_eq!(config.endpoints.len(), 1);
            assert_eq!(config.endpoints[0].workload_type, "container");
            assert_eq!(config.endpoints[0].name, BARE_ENDPOINT_NAME);
            assert_eq!(config.endpoints[0].endpoint, bare);
        }
    }

    #[test]
    fn the_name_default_is_reserved() {
        let e = err(&flags_with_endpoints("container:default:unix:///run/x.sock"));
        assert_eq!(
            e,
            "--container-runtime-endpoint item \"container:default:unix:///run/x.sock\": the endpoint name \"default\" is reserved"
        );
    }

    #[test]
    fn duplicate_names_and_sockets_are_rejected_naming_the_item() {
        let e = err(&flags_with_endpoints("container:a:unix:///run/a.sock;container:a:unix:///run/b.sock"));
        assert!(e.contains("\"container:a:unix:///run/b.sock\""), "{e}");
        assert!(e.contains("endpoint name \"a\" is used twice"), "{e}");
        let e = err(&flags_with_endpoints("container:a:unix:///run/a.sock;container:b:/run/a.sock"));
        assert!(e.contains("socket /run/a.sock is already endpoint \"a\""), "{e}");
    }

    #[test]
    fn unknown_workload_types_bad_names_and_empty_endpoints_are_rejected() {
        let e = err(&flags_with_endpoints("vm:kvm:unix:///run/kvm.sock"));
        assert!(e.contains("workload type \"vm\" is not supported (supported: container)"), "{e}");
        let e = err(&flags_with_endpoints("container:Berth:unix:///run/b.sock"));
        assert!(e.contains("must be a DNS label"), "{e}");
        let e = err(&flags_with_endpoints("container:berth:"));
        assert!(e.contains("the endpoint is empty"), "{e}");
        let e = err(&flags_with_endpoints("container:berth"));
        assert!(e.contains("expected workloadType:name:endpoint"), "{e}");
        let e = err(&flags_with_endpoints("container:berth:tcp://1.2.3.4:5"));
        assert!(e.contains("is not unix:///path/to/socket"), "{e}");
        let e = err(&flags_with_endpoints(" ; "));
        assert!(e.contains("no endpoint given"), "{e}");
    }

    #[test]
    fn the_file_gives_every_key_and_flags_override_it() {
        let f = file(
            r#"
node_name = "node-a"
kubeconfig = "node-a.kubeconfig"
port = 10251
partial_readiness = true
image_gc_high_threshold = 90
image_gc_low_threshold = 70
root_dir = "/var/lib/berth/agent-a"
[[endpoints]]
workload_type = "container"
name = "berth"
endpoint = "unix:///run/berth/runtime.sock"
image_endpoint = ""
[[endpoints]]
name = "containerd"
endpoint = "unix:///run/containerd/containerd.sock"
handlers = ["runc"]
"#,
        );
        let config = Config::resolve(&Flags::default(), f.clone(), "host").unwrap();
        assert_eq!(config.node_name, "node-a");
        assert_eq!(config.kubeconfig, Some(PathBuf::from("/etc/berth/node-a.kubeconfig")), "relative to the file");
        assert_eq!(config.port, 10251);
        assert!(config.partial_readiness);
        assert_eq!((config.image_gc_high_threshold, config.image_gc_low_threshold), (90, 70));
        assert_eq!(config.root_dir, PathBuf::from("/var/lib/berth/agent-a"));
        assert_eq!(config.endpoints.len(), 2);
        assert_eq!(config.endpoints[1].workload_type, "container", "the default workload type");
        assert_eq!(config.endpoints[1].handlers, vec!["runc".to_string()]);

        let flags = Flags {
            node_name: Some("node-b".into()),
            port: Some(10252),
            partial_readiness: Some(false),
            container_runtime_endpoint: Some("unix:///run/x.sock".into()),
            ..Default::default()
        };
        let config = Config::resolve(&flags, f, "host").unwrap();
        assert_eq!((config.node_name.as_str(), config.port, config.partial_readiness), ("node-b", 10252, false));
        assert_eq!(config.endpoints.len(), 1, "the flag's endpoints replace the file's");
    }

    #[test]
    fn defaults_are_the_lowercased_hostname_port_10250_and_berths_runtime() {
        let config = resolve(&Flags::default()).unwrap();
        assert_eq!(config.node_name, "node-a");
        assert_eq!(config.port, DEFAULT_PORT);
        assert!(!config.partial_readiness);
        assert_eq!((config.image_gc_high_threshold, config.image_gc_low_threshold), (85, 80));
        assert_eq!(config.root_dir, PathBuf::from(DEFAULT_ROOT_DIR));
        assert_eq!(config.endpoints[0].name, "berth");
        assert_eq!(config.endpoints[0].endpoint, DEFAULT_ENDPOINT);
    }

    #[test]
    fn unknown_file_keys_and_bad_toml_are_errors() {
        let e = FileConfig::parse("nodename = \"x\"\n", Path::new("/a.toml")).unwrap_err();
        assert!(matches!(e, ConfigError::Parse { .. }), "{e}");
        let e = FileConfig::parse("[[endpoints]]\nname = \"x\"\n", Path::new("/a.toml")).unwrap_err();
        assert!(format!("{:?}", e).contains("endpoint"), "{e:?}");
    }

    #[test]
    fn file_endpoints_are_named_by_index_in_errors() {
        let f = file(
            "[[endpoints]]\nname = \"a\"\nendpoint = \"unix:///a.sock\"\n[[endpoints]]\nname = \"default\"\nendpoint = \"unix:///b.sock\"\n",
        );
        let e = Config::resolve(&Flags::default(), f, "h").unwrap_err().to_string();
        assert_eq!(e, "endpoints[1] (name \"default\"): the endpoint name \"default\" is reserved");
    }

    #[test]
    fn image_endpoints_attach_to_runtime_endpoints_by_name() {
        let flags = Flags {
            container_runtime_endpoint: Some("container:a:unix:///a.sock;container:b:unix:///b.sock".into()),
            image_service_endpoint: Some("container:b:unix:///b-images.sock".into()),
            ..Default::default()
        };
        let config = resolve(&flags).unwrap();
        assert_eq!(config.endpoints[0].image_endpoint, "");
        assert_eq!(config.endpoints[1].image_endpoint, "unix:///b-images.sock");

        let flags = Flags { image_service_endpoint: Some("container:c:unix:///c.sock".into()), ..flags };
        assert!(err(&flags).contains("no runtime endpoint is named \"c\" (configured: a, b)"));
        let flags = Flags { image_service_endpoint: Some("unix:///i.sock".into()), ..flags };
        assert!(err(&flags).contains("a bare image endpoint needs exactly one runtime endpoint"));
        let single = Flags {
            container_runtime_endpoint: Some("unix:///a.sock".into()),
            image_service_endpoint: Some("unix:///i.sock".into()),
            ..Default::default()
        };
        assert_eq!(resolve(&single).unwrap().endpoints[0].image_endpoint, "unix:///i.sock");
    }

    #[test]
    fn image_gc_thresholds_follow_kubelets_rules() {
        let flags = Flags { image_gc_high_threshold: Some(101), ..Default::default() };
        assert!(err(&flags).contains("101 must be between 0 and 100, inclusive"));
        let flags = Flags { image_gc_high_threshold: Some(50), image_gc_low_threshold: Some(60), ..Default::default() };
        assert!(err(&flags).contains("60 must be less than or equal to --image-gc-high-threshold 50"));
    }

    #[test]
    fn a_node_name_must_be_a_dns_subdomain() {
        let flags = Flags { node_name: Some("Node_A".into()), ..Default::default() };
        assert!(err(&flags).contains("is not a DNS subdomain"));
    }

    #[test]
    fn settings_that_need_a_restart_are_named() {
        let a = resolve(&Flags::default()).unwrap();
        let b = Config { port: 1, partial_readiness: true, endpoints: Vec::new(), ..a.clone() };
        assert_eq!(a.needs_restart_for(&b), vec!["port"]);
    }
}
