//! CNI network configuration: loading and validating the first config of a directory, writing
//! berth's default conflist into a directory that has none, and moving berth's default network
//! to the node's pod CIDR ([`follow_pod_cidr`]).
//!
//! As the CNI spec's runtimes do, the config directory is read in lexical order of file names and
//! the first `*.conflist`, `*.conf` or `*.json` file is the network. A `.conf`/`.json` file holding a
//! single plugin is wrapped into a list of one, named after the plugin's `name`.

use std::collections::BTreeSet;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

/// Where berth reads CNI network configs by default.
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
/// The file name [`write_default`] writes.
pub const DEFAULT_CONFLIST_NAME: &str = "10-berth.conflist";
/// Where berth's default network keeps its IP allocations (host-local's `dataDir`).
pub const DEFAULT_IPAM_DATA_DIR: &str = "/var/lib/berth/cni/networks";

const EXTENSIONS: [&str; 3] = ["conflist", "conf", "json"];

/// Errors of loading, validating and writing network configs.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The directory holds no `*.conflist`, `*.conf` or `*.json` file (or does not exist).
    #[error("no CNI network config (*.conflist, *.conf, *.json) in {dir:?}")]
    ConfigNotFound { dir: PathBuf },
    /// The directory or a config file could not be read.
    #[error("reading CNI config {path:?}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The file is not JSON.
    #[error("CNI config {path:?} is not valid JSON")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The file is JSON but not a usable network config.
    #[error("invalid CNI config {path:?}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    /// A pod CIDR to follow names no IPv4 subnet.
    #[error("pod CIDR {cidr:?} has no IPv4 subnet such as 10.244.1.0/24")]
    PodCidr { cidr: String },
    /// The default config could not be written.
    #[error("writing CNI config {path:?}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// One plugin of a network config list.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginConfig {
    /// The plugin's `type`: the name of its binary.
    pub plugin_type: String,
    /// The capabilities the plugin declares (`"capabilities": {"portMappings": true}`).
    pub capabilities: BTreeSet<String>,
    /// The plugin's config as written, without the list's `name` and `cniVersion`.
    pub raw: Map<String, Value>,
}

/// A validated network config list.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkConfigList {
    pub name: String,
    pub cni_version: String,
    /// `disableCheck`: the runtime must not run CHECK for this network.
    pub disable_check: bool,
    pub plugins: Vec<PluginConfig>,
    /// The file the list came from, if any.
    pub source: Option<PathBuf>,
}

impl NetworkConfigList {
    /// Parses a config list, or a single plugin config wrapped into a list of one.
    ///
    /// `origin` names the config in errors.
    pub fn from_json(value: Value, origin: &Path) -> Result<Self, ConfigError> {
        let invalid = |reason: String| ConfigError::Invalid { path: origin.to_owned(), reason };
        let Value::Object(mut top) = value else {
            return Err(invalid("expected a JSON object".into()));
        };
        let name = string_field(&top, "name").map_err(invalid)?;
        let cni_version = string_field(&top, "cniVersion").map_err(invalid)?;
        validate_name(&name).map_err(invalid)?;
        validate_version(&cni_version).map_err(invalid)?;
        let disable_check = top.get("disableCheck").and_then(Value::as_bool).unwrap_or(false);
        let plugin_values = match top.remove("plugins") {
            Some(Value::Array(plugins)) => plugins,
            Some(_) => return Err(invalid("\"plugins\" must be an array".into())),
            // A single plugin config: the whole object is the one plugin.
            None => vec![Value::Object(top)],
        };
        if plugin_values.is_empty() {
            return Err(invalid("\"plugins\" is empty".into()));
        }
        let plugins = plugin_values
            .into_iter()
            .enumerate()
            .map(|(i, plugin)| PluginConfig::from_json(plugin).map_err(|e| invalid(format!("plugin {i}: {e}"))))
            .collect::<Result<_, _>>()?;
        Ok(Self { name, cni_version, disable_check, plugins, source: Some(origin.to_owned()) })
    }

    /// The list as JSON, the form kept in the result cache so DEL runs what ADD ran.
    pub fn to_json(&self) -> Value {
        let plugins: Vec<Value> = self.plugins.iter().map(|p| Value::Object(p.raw.clone())).collect();
        json!({
            "cniVersion": self.cni_version,
            "name": self.name,
            "disableCheck": self.disable_check,
            "plugins": plugins,
        })
    }

    /// The distinct plugin types, in order of first use.
    pub fn plugin_types(&self) -> Vec<&str> {
        let mut seen = BTreeSet::new();
        self.plugins.iter().map(|p| p.plugin_type.as_str()).filter(|t| seen.insert(*t)).collect()
    }
}

impl PluginConfig {
    fn from_json(value: Value) -> Result<Self, String> {
        let Value::Object(mut raw) = value else {
            return Err("expected a JSON object".into());
        };
        let plugin_type = string_field(&raw, "type")?;
        if plugin_type.contains('/') || plugin_type == "." || plugin_type == ".." {
            return Err(format!("\"type\" {plugin_type:?} is not a plugin binary name"));
        }
        let capabilities = match raw.get("capabilities") {
            None => BTreeSet::new(),
            Some(Value::Object(caps)) => {
                caps.iter().filter(|(_, on)| on.as_bool() == Some(true)).map(|(k, _)| k.clone()).collect()
            }
            Some(_) => return Err("\"capabilities\" must be an object".into()),
        };
        // The list's name and version are injected at exec time; keep the plugin's own copy out.
        raw.remove("name");
        raw.remove("cniVersion");
        Ok(Self { plugin_type, capabilities, raw })
    }
}

fn string_field(object: &Map<String, Value>, key: &str) -> Result<String, String> {
    match object.get(key) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Value::String(_)) | None => Err(format!("{key:?} is missing or empty")),
        Some(_) => Err(format!("{key:?} must be a string")),
    }
}

/// Network names as the CNI spec allows them: alphanumerics first, then also `_`, `.` and `-`.
fn validate_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
        return Err(format!("network name {name:?} must match [a-zA-Z0-9][a-zA-Z0-9_.-]*"));
    }
    Ok(())
}

fn validate_version(version: &str) -> Result<(), String> {
    let parts: Vec<&str> = version.split('.').collect();
    if parts.len() != 3 || parts.iter().any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
        return Err(format!("cniVersion {version:?} is not a version like \"1.0.0\""));
    }
    Ok(())
}

/// The config files of a directory in the order the first one is chosen: lexical by file name.
///
/// A missing directory has no files.
pub fn config_files(conf_dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let entries = match std::fs::read_dir(conf_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(ConfigError::Read { path: conf_dir.to_owned(), source }),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| ConfigError::Read { path: conf_dir.to_owned(), source })?;
        let path = entry.path();
        let wanted = path.extension().and_then(|e| e.to_str()).is_some_and(|e| EXTENSIONS.contains(&e));
        // Follow symlinks (config dirs are often managed by symlinking files in).
        if wanted && path.is_file() {
            files.push(path);
        }
    }
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}

/// Loads and validates one config file.
pub fn load_file(path: &Path) -> Result<NetworkConfigList, ConfigError> {
    let bytes = std::fs::read(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
    let value: Value =
        serde_json::from_slice(&bytes).map_err(|source| ConfigError::Parse { path: path.to_owned(), source })?;
    NetworkConfigList::from_json(value, path)
}

/// Loads the network of a config directory: its lexically first config file.
///
/// A broken first file is an error naming it, not a reason to fall through to the next one: the
/// operator meant that file to be the network.
pub fn load(conf_dir: &Path) -> Result<NetworkConfigList, ConfigError> {
    let files = config_files(conf_dir)?;
    let first = files.first().ok_or_else(|| ConfigError::ConfigNotFound { dir: conf_dir.to_owned() })?;
    load_file(first)
}

/// berth's default network: a bridge with host-local IPAM and port mappings.
///
/// The loopback plugin is not part of the list: [`crate::Cni`] runs it on `lo` as a network of its
/// own before this one, as containerd does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultNetwork {
    /// The network name (also part of portmap's and the bridge's iptables chain names).
    pub name: String,
    /// The Linux bridge the pods' veths are attached to.
    pub bridge: String,
    /// The pod subnet in CIDR form.
    pub subnet: String,
    /// host-local's `dataDir`, where IP allocations are kept.
    pub ipam_data_dir: PathBuf,
    /// Masquerade traffic leaving the subnet.
    pub ip_masq: bool,
}

impl Default for DefaultNetwork {
    fn default() -> Self {
        Self {
            name: "berth".into(),
            bridge: "berth0".into(),
            subnet: "10.88.0.0/16".into(),
            ipam_data_dir: PathBuf::from(DEFAULT_IPAM_DATA_DIR),
            ip_masq: true,
        }
    }
}

impl DefaultNetwork {
    /// The conflist as JSON.
    pub fn conflist(&self) -> Value {
        json!({
            "cniVersion": "1.0.0",
            "name": self.name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": true,
                    "ipMasq": self.ip_masq,
                    "hairpinMode": true,
                    // The gateway address follows the subnet when it moves to the node's pod CIDR.
                    "forceAddress": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{ "subnet": self.subnet }]],
                        "routes": [{ "dst": "0.0.0.0/0" }],
                        "dataDir": self.ipam_data_dir,
                    }
                },
                { "type": "portmap", "capabilities": { "portMappings": true } }
            ]
        })
    }
}

impl DefaultNetwork {
    /// The settings of a conflist that is exactly what berth writes for some settings, or `None`
    /// for anything else: a config someone wrote or edited is theirs, and berth leaves it alone.
    pub fn recognize(conflist: &Value) -> Option<DefaultNetwork> {
        let bridge = conflist.get("plugins")?.get(0)?;
        let ipam = bridge.get("ipam")?;
        let network = DefaultNetwork {
            name: conflist.get("name")?.as_str()?.to_string(),
            bridge: bridge.get("bridge")?.as_str()?.to_string(),
            subnet: ipam.get("ranges")?.get(0)?.get(0)?.get("subnet")?.as_str()?.to_string(),
            ipam_data_dir: PathBuf::from(ipam.get("dataDir")?.as_str()?),
            ip_masq: bridge.get("ipMasq")?.as_bool()?,
        };
        (network.conflist() == *conflist).then_some(network)
    }
}

/// Writes `10-berth.conflist` for `network` into `conf_dir` when the directory has no config.
///
/// Returns the path written, or `None` when a config was already there. The file appears
/// atomically (written aside, then renamed), so a concurrent reader never sees half of it.
pub fn write_default(conf_dir: &Path, network: &DefaultNetwork) -> Result<Option<PathBuf>, ConfigError> {
    if !config_files(conf_dir)?.is_empty() {
        return Ok(None);
    }
    let path = conf_dir.join(DEFAULT_CONFLIST_NAME);
    write_network(&path, network)?;
    tracing::info!(path = %path.display(), bridge = %network.bridge, subnet = %network.subnet, "wrote default CNI config");
    Ok(Some(path))
}

/// Writes `network`'s conflist to `path` atomically (written aside, then renamed).
pub fn write_network(path: &Path, network: &DefaultNetwork) -> Result<(), ConfigError> {
    let write_err = |source| ConfigError::Write { path: path.to_owned(), source };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(write_err)?;
    let mut text = serde_json::to_vec_pretty(&network.conflist()).map_err(|e| write_err(e.into()))?;
    text.push(b'\n');
    let mut tmp = tempfile_in(dir).map_err(write_err)?;
    tmp.1.write_all(&text).and_then(|()| tmp.1.sync_all()).map_err(write_err)?;
    std::fs::rename(&tmp.0, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp.0);
        write_err(e)
    })
}

/// What [`follow_pod_cidr`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodCidrOutcome {
    /// berth's default network in this file now hands out addresses from the pod CIDR.
    Moved { path: PathBuf, from: String },
    /// berth's default network in this file already used the pod CIDR.
    Unchanged { path: PathBuf },
    /// The network in use is not berth's default: its own range stays.
    NotDefault { path: PathBuf },
    /// There was no config: berth's default was written with the pod CIDR.
    Written { path: PathBuf },
}

/// Moves berth's default network to the node's pod CIDR: when the network in use (the first
/// config of `conf_dir`) is exactly a conflist berth writes, it is rewritten atomically with
/// `subnet`, so the next sandbox gets an address of the node's range; an empty directory gets
/// `fallback` with `subnet`. Anyone else's config is left as it is.
///
/// A node with a pod CIDR is part of a cluster whose pods reach each other's addresses
/// untranslated, so the moved network stops masquerading: the bridge plugin would masquerade
/// everything leaving the node's range, other nodes' pods included. The node's Service proxy
/// masquerades what leaves the cluster instead.
///
/// `subnet` is the CRI `podCIDR`: one CIDR, or several comma-separated (dual stack), of which
/// the first IPv4 one is used.
pub fn follow_pod_cidr(
    conf_dir: &Path,
    fallback: &DefaultNetwork,
    subnet: &str,
) -> Result<PodCidrOutcome, ConfigError> {
    let subnet = ipv4_subnet(subnet).ok_or_else(|| ConfigError::PodCidr { cidr: subnet.to_string() })?;
    let Some(path) = config_files(conf_dir)?.into_iter().next() else {
        let path = conf_dir.join(DEFAULT_CONFLIST_NAME);
        write_network(&path, &DefaultNetwork { subnet, ip_masq: false, ..fallback.clone() })?;
        return Ok(PodCidrOutcome::Written { path });
    };
    let bytes = std::fs::read(&path).map_err(|source| ConfigError::Read { path: path.clone(), source })?;
    let Some(current) = serde_json::from_slice(&bytes).ok().as_ref().and_then(DefaultNetwork::recognize) else {
        return Ok(PodCidrOutcome::NotDefault { path });
    };
    if current.subnet == subnet && !current.ip_masq {
        return Ok(PodCidrOutcome::Unchanged { path });
    }
    let from = current.subnet.clone();
    write_network(&path, &DefaultNetwork { subnet, ip_masq: false, ..current })?;
    Ok(PodCidrOutcome::Moved { path, from })
}

/// The first IPv4 `a.b.c.d/n` of a comma-separated list, with its host bits cleared.
fn ipv4_subnet(list: &str) -> Option<String> {
    list.split(',').map(str::trim).find_map(|cidr| {
        let (addr, bits) = cidr.split_once('/')?;
        let addr: std::net::Ipv4Addr = addr.parse().ok()?;
        let bits: u32 = bits.parse().ok().filter(|b| (1..=30).contains(b))?;
        let network = u32::from(addr) & (u32::MAX << (32 - bits));
        Some(format!("{}/{bits}", std::net::Ipv4Addr::from(network)))
    })
}

/// A new file in `dir` whose name the config loader ignores (no config extension).
fn tempfile_in(dir: &Path) -> io::Result<(PathBuf, std::fs::File)> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!(".{DEFAULT_CONFLIST_NAME}.{}.{seq}.tmp", std::process::id()));
    let file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(&path)?;
    Ok((path, file))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    const LIST: &str = r#"{"cniVersion":"1.0.0","name":"net-a","plugins":[
        {"type":"bridge","name":"ignored","bridge":"br0"},
        {"type":"portmap","capabilities":{"portMappings":true,"bandwidth":false}}]}"#;

    #[test]
    fn the_lexically_first_config_file_is_the_network() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "20-b.conflist", &LIST.replace("net-a", "net-b"));
        write(dir.path(), "10-a.conflist", LIST);
        write(dir.path(), "05-notes.txt", "not a config");
        let list = load(dir.path()).unwrap();
        assert_eq!(list.name, "net-a");
        assert_eq!(list.cni_version, "1.0.0");
        assert_eq!(list.plugin_types(), ["bridge", "portmap"]);
        assert_eq!(list.source.as_deref(), Some(dir.path().join("10-a.conflist").as_path()));
    }

    #[test]
    fn declared_capabilities_are_those_set_to_true_and_plugin_names_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "10-a.conflist", LIST);
        let list = load(dir.path()).unwrap();
        assert!(list.plugins[0].capabilities.is_empty());
        assert!(!list.plugins[0].raw.contains_key("name"));
        assert_eq!(list.plugins[1].capabilities, BTreeSet::from(["portMappings".to_string()]));
    }

    #[test]
    fn a_single_plugin_conf_file_is_wrapped_into_a_list_of_one() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "99-single.conf", r#"{"cniVersion":"0.4.0","name":"single","type":"ptp","ipMasq":true}"#);
        let list = load(dir.path()).unwrap();
        assert_eq!((list.name.as_str(), list.cni_version.as_str()), ("single", "0.4.0"));
        assert_eq!(list.plugin_types(), ["ptp"]);
        assert_eq!(list.plugins[0].raw.get("ipMasq"), Some(&Value::Bool(true)));
    }

    #[test]
    fn an_empty_or_missing_directory_is_config_not_found() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(load(dir.path()), Err(ConfigError::ConfigNotFound { .. })));
        assert!(matches!(load(&dir.path().join("nope")), Err(ConfigError::ConfigNotFound { .. })));
    }

    #[test]
    fn invalid_lists_are_rejected_with_the_reason_and_file() {
        let cases = [
            (r#"{"cniVersion":"1.0.0","plugins":[{"type":"bridge"}]}"#, "\"name\""),
            (r#"{"name":"n","plugins":[{"type":"bridge"}]}"#, "\"cniVersion\""),
            (r#"{"cniVersion":"1.0","name":"n","plugins":[{"type":"bridge"}]}"#, "cniVersion"),
            (r#"{"cniVersion":"1.0.0","name":"n","plugins":[]}"#, "empty"),
            (r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"bridge":"x"}]}"#, "\"type\""),
            (r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"../evil"}]}"#, "binary name"),
            (r#"{"cniVersion":"1.0.0","name":"-bad","plugins":[{"type":"bridge"}]}"#, "network name"),
        ];
        for (text, needle) in cases {
            let dir = tempfile::tempdir().unwrap();
            write(dir.path(), "10.conflist", text);
            let err = load(dir.path()).unwrap_err();
            let message = err.to_string();
            assert!(matches!(err, ConfigError::Invalid { .. }), "{text}: {err:?}");
            assert!(message.contains(needle) && message.contains("10.conflist"), "{text}: {message}");
        }
    }

    #[test]
    fn a_file_that_is_not_json_is_a_parse_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "10.conflist", "{ nope");
        assert!(matches!(load(dir.path()), Err(ConfigError::Parse { path, .. }) if path.ends_with("10.conflist")));
    }

    #[test]
    fn the_default_is_written_only_into_a_directory_without_config() {
        let dir = tempfile::tempdir().unwrap();
        let conf_dir = dir.path().join("net.d");
        let network = DefaultNetwork { ipam_data_dir: dir.path().join("ipam"), ..DefaultNetwork::default() };
        let written = write_default(&conf_dir, &network).unwrap().unwrap();
        assert_eq!(written, conf_dir.join("10-berth.conflist"));
        assert_eq!(config_files(&conf_dir).unwrap(), vec![written.clone()]);
        let list = load(&conf_dir).unwrap();
        assert_eq!(list.name, "berth");
        assert_eq!(list.plugin_types(), ["bridge", "portmap"]);
        let bridge = &list.plugins[0].raw;
        assert_eq!(bridge["bridge"], "berth0");
        assert_eq!(
            (&bridge["isGateway"], &bridge["ipMasq"], &bridge["hairpinMode"]),
            (&json!(true), &json!(true), &json!(true))
        );
        assert_eq!(bridge["ipam"]["type"], "host-local");
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "10.88.0.0/16");
        assert_eq!(bridge["ipam"]["routes"][0]["dst"], "0.0.0.0/0");
        assert_eq!(bridge["ipam"]["dataDir"], json!(dir.path().join("ipam")));
        assert!(list.plugins[1].capabilities.contains("portMappings"));

        // Now that there is a config, nothing is written, and an operator's own config is kept.
        std::fs::remove_file(&written).unwrap();
        write(&conf_dir, "50-mine.conflist", LIST);
        assert_eq!(write_default(&conf_dir, &network).unwrap(), None);
        assert_eq!(load(&conf_dir).unwrap().name, "net-a");
    }

    fn default_in(dir: &Path) -> DefaultNetwork {
        DefaultNetwork { ipam_data_dir: dir.join("ipam"), ..DefaultNetwork::default() }
    }

    fn subnet_of(path: &Path) -> String {
        let value: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        value["plugins"][0]["ipam"]["ranges"][0][0]["subnet"].as_str().unwrap().to_string()
    }

    #[test]
    fn berths_default_network_moves_to_the_pod_cidr_and_keeps_its_other_settings() {
        let dir = tempfile::tempdir().unwrap();
        let conf_dir = dir.path().join("net.d");
        let network = DefaultNetwork { bridge: "berth7".into(), ..default_in(dir.path()) };
        let path = write_default(&conf_dir, &network).unwrap().unwrap();
        let outcome = follow_pod_cidr(&conf_dir, &DefaultNetwork::default(), "10.244.3.0/24").unwrap();
        assert_eq!(outcome, PodCidrOutcome::Moved { path: path.clone(), from: "10.88.0.0/16".into() });
        assert_eq!(subnet_of(&path), "10.244.3.0/24");
        let list = load(&conf_dir).unwrap();
        assert_eq!(list.plugins[0].raw["bridge"], "berth7");
        assert_eq!(list.plugins[0].raw["ipam"]["dataDir"], json!(dir.path().join("ipam")));
        assert_eq!(list.plugins[0].raw["ipMasq"], false, "the cluster's pods see each other's addresses");
        assert_eq!(config_files(&conf_dir).unwrap(), vec![path.clone()], "no temporary file is left");
        assert_eq!(
            follow_pod_cidr(&conf_dir, &DefaultNetwork::default(), "10.244.3.0/24").unwrap(),
            PodCidrOutcome::Unchanged { path }
        );
    }

    #[test]
    fn an_operators_config_keeps_its_range_even_when_it_looks_like_berths() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "10-a.conflist", LIST);
        let path = dir.path().join("10-a.conflist");
        let outcome = follow_pod_cidr(dir.path(), &DefaultNetwork::default(), "10.244.3.0/24").unwrap();
        assert_eq!(outcome, PodCidrOutcome::NotDefault { path: path.clone() });
        assert_eq!(std::fs::read_to_string(&path).unwrap(), LIST);

        let mut edited = default_in(dir.path()).conflist();
        edited["plugins"][0]["mtu"] = json!(1400);
        write(dir.path(), "05-edited.conflist", &edited.to_string());
        let outcome = follow_pod_cidr(dir.path(), &DefaultNetwork::default(), "10.244.3.0/24").unwrap();
        assert_eq!(outcome, PodCidrOutcome::NotDefault { path: dir.path().join("05-edited.conflist") });
        assert_eq!(subnet_of(&dir.path().join("05-edited.conflist")), "10.88.0.0/16");
    }

    #[test]
    fn an_empty_directory_gets_the_default_network_in_the_pod_cidr() {
        let dir = tempfile::tempdir().unwrap();
        let conf_dir = dir.path().join("net.d");
        let outcome = follow_pod_cidr(&conf_dir, &default_in(dir.path()), "10.244.9.0/24").unwrap();
        let path = conf_dir.join(DEFAULT_CONFLIST_NAME);
        assert_eq!(outcome, PodCidrOutcome::Written { path: path.clone() });
        assert_eq!(subnet_of(&path), "10.244.9.0/24");
    }

    #[test]
    fn the_first_ipv4_subnet_of_a_dual_stack_pod_cidr_is_used_and_garbage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let conf_dir = dir.path().join("net.d");
        write_default(&conf_dir, &default_in(dir.path())).unwrap();
        follow_pod_cidr(&conf_dir, &DefaultNetwork::default(), "fd00:1::/64, 10.244.5.0/24").unwrap();
        assert_eq!(subnet_of(&conf_dir.join(DEFAULT_CONFLIST_NAME)), "10.244.5.0/24");
        let err = follow_pod_cidr(&conf_dir, &DefaultNetwork::default(), "fd00:1::/64").unwrap_err();
        assert!(err.to_string().contains("has no IPv4 subnet"), "{err}");
        assert!(follow_pod_cidr(&conf_dir, &DefaultNetwork::default(), "10.244.5.0").is_err());
    }

    #[test]
    fn a_list_survives_a_round_trip_through_its_json_form() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "10-a.conflist", LIST);
        let list = load(dir.path()).unwrap();
        let again = NetworkConfigList::from_json(list.to_json(), &dir.path().join("10-a.conflist")).unwrap();
        assert_eq!(again, list);
    }
}
