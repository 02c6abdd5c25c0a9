//! The runtime's TOML configuration file: socket, store root, runtime handlers with their guest
//! platforms, CNI directories and registry hosts; parsing, defaults, discovery and validation.
//! Each handler is resolved here, once, into a [`RuntimeHandler`] that sandbox and container code
//! are handed instead of its name.
//!
//! ```toml
//! socket = "/run/berth/runtime.sock"
//! root = "/var/lib/berth/runtime"
//! default_handler = "runc"
//! [handlers.gvisor]
//! binary = "runsc"
//! args = ["--platform=ptrace", "--network=host"]
//! isolation = "sandbox-per-container"   # the default for runsc; else "shared-pod-namespaces"
//! # the default for runsc: what gVisor releases up to 2022 refuse; [] for a newer runsc
//! unsupported_capabilities = ["CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE"]
//! platform = "linux/amd64"
//! [registries."127.0.0.1:5000"]
//! insecure = true
//! ```
//!
//! A file without `[handlers]` (or no file at the default path) gets the handlers found on PATH:
//! `runc`, `crun` and `gvisor` (runsc), each with the host's platform.
//!
//! runsc is run with `--oci-seccomp` (so that it enforces the spec's seccomp profile) unless
//! `args` set that flag.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use berth_image::{ImagesConfig, Platform, RegistryHost};
use berth_oci::OciRuntime;
use berth_oci::runtime::ProcessSpawner;
use berth_oci::spec::RuntimeGaps;
use oci_spec::runtime::Capability;
use serde::{Deserialize, Serialize};

pub const DEFAULT_CONFIG_PATH: &str = "/etc/berth/runtime.toml";
pub const DEFAULT_SOCKET: &str = "/run/berth/runtime.sock";
pub const DEFAULT_ROOT: &str = "/var/lib/berth/runtime";
pub const DEFAULT_HANDLER: &str = "runc";
pub const DEFAULT_CNI_CONF_DIR: &str = "/etc/cni/net.d";
pub const DEFAULT_CNI_BIN_DIRS: [&str; 2] = ["/usr/lib/cni", "/opt/cni/bin"];

/// The handlers `berth runtime` configures by itself when the file names none:
/// (handler name, binary, global args).
const KNOWN_RUNTIMES: [(&str, &str, &[&str]); 3] =
    [("runc", "runc", &[]), ("crun", "crun", &[]), ("gvisor", "runsc", &["--platform=ptrace", "--network=host"])];

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
    /// A value is wrong; `key` is its dotted path in the file (`handlers.gvisor.platform`).
    #[error("{key}: {reason}")]
    Invalid { key: String, reason: String },
    #[error("no runtime handler configured and none of runc, crun, runsc found on PATH")]
    NoHandlers,
}

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key: key.into(), reason: reason.into() }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The CRI unix socket.
    pub socket: PathBuf,
    /// State root: images under `images/`, and (next) sandboxes and containers beside them.
    pub root: PathBuf,
    /// The handler an empty `runtime_handler` means; always a key of `handlers`.
    pub default_handler: String,
    pub handlers: BTreeMap<String, Arc<RuntimeHandler>>,
    pub cni: Cni,
    /// Registry host (`docker.io`, `127.0.0.1:5000`) → mirrors, TLS settings.
    pub registries: BTreeMap<String, RegistryHost>,
}

/// One runtime handler, the OCI runtime a RuntimeClass names, resolved once when the config is
/// loaded: everything sandbox and container code need to know about it, so they are handed this
/// (in an `Arc`) rather than a name to look up again.
#[derive(Debug, Clone)]
pub struct RuntimeHandler {
    pub name: String,
    /// Name on PATH or absolute path of the OCI runtime binary, as configured.
    pub binary: PathBuf,
    /// Global flags put before the subcommand.
    pub args: Vec<String>,
    /// The runtime's own state dir (`--root`), if not its default.
    pub root: Option<PathBuf>,
    /// How the handler's containers share their pod.
    pub isolation: Isolation,
    /// What the OCI runtime does not do, worked around in every spec generated for this handler:
    /// for runsc, the capabilities it refuses (the `unsupported_capabilities` key) and masked and
    /// read-only paths (it ignores them).
    pub gaps: RuntimeGaps,
    /// Guest platform images are chosen for: the configured one, else the host's.
    pub platform: Platform,
    /// Pod and container annotations passed into the OCI spec.
    pub allowed_annotations: Vec<String>,
    /// Whether privileged pods may use this handler.
    pub privileged: bool,
    /// `binary` (a bare name found on PATH once, here), `args` (for runsc with `--oci-seccomp`
    /// added, see [`runtime_args`]) and `root` as one OCI runtime.
    oci: OciRuntime,
}

impl RuntimeHandler {
    /// The OCI runtime that runs this handler's containers.
    pub fn oci(&self) -> &OciRuntime {
        &self.oci
    }
}

/// How a handler's containers share their pod: the one difference between runc/crun and gVisor
/// that sandbox and container code act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Isolation {
    /// runc, crun: a small infra process holds the pod's IPC, UTS and (when shared) PID
    /// namespaces, which every container joins; the pod has a `/dev/shm` tmpfs.
    SharedPodNamespaces,
    /// runsc: each container is its own sandbox in the pod's network namespace, with IPC, UTS and
    /// PID namespaces of its own and no infra process; its init runs inside the sandbox (signalled
    /// through the OCI runtime), and removing it (a slow `runsc delete`) finishes in the background.
    SandboxPerContainer,
}

impl Isolation {
    /// The spellings of the `isolation` key.
    const NAMES: [(&str, Isolation); 2] = [
        ("shared-pod-namespaces", Isolation::SharedPodNamespaces),
        ("sandbox-per-container", Isolation::SandboxPerContainer),
    ];

    fn parse(s: &str) -> Option<Isolation> {
        Isolation::NAMES.iter().find(|(name, _)| *name == s).map(|(_, i)| *i)
    }

    /// Without an `isolation` key: sandbox-per-container for gVisor's `runsc`, shared pod
    /// namespaces for anything else.
    pub fn default_for(binary: &Path) -> Isolation {
        if is_runsc(binary) { Isolation::SandboxPerContainer } else { Isolation::SharedPodNamespaces }
    }
}

/// gVisor's `runsc`: a binary whose file name contains it.
fn is_runsc(binary: &Path) -> bool {
    binary.file_name().is_some_and(|n| n.to_string_lossy().contains("runsc"))
}

/// What gVisor releases up to at least 2022-12 (Debian's runsc 0.0~20221219) refuse: their
/// sandbox knows no capability after `CAP_AUDIT_READ`, and boot fails with `converting
/// capabilities: unknown capability "CAP_BPF"` when any set of the spec names one (tried one by
/// one for all 41 capabilities in the bounding, effective, permitted and inheritable sets).
const GVISOR_2022_UNSUPPORTED_CAPABILITIES: [Capability; 3] =
    [Capability::Perfmon, Capability::Bpf, Capability::CheckpointRestore];

/// What a handler's OCI runtime does not do, from its binary: for `runsc`, the capabilities
/// gVisor's 2022 releases refuse (unless `unsupported` names others: `[]` for a newer runsc that
/// knows them) and masked and read-only paths, which runsc ignores; nothing for anything else.
fn runtime_gaps(binary: &Path, unsupported: Option<Vec<Capability>>) -> RuntimeGaps {
    let runsc = is_runsc(binary);
    let default = || if runsc { GVISOR_2022_UNSUPPORTED_CAPABILITIES.to_vec() } else { Vec::new() };
    RuntimeGaps {
        unsupported_capabilities: unsupported.unwrap_or_else(default),
        ignores_masked_and_readonly_paths: runsc,
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cni {
    /// Where conflists are read from (a default one is written here if none exists).
    #[serde(default = "default_cni_conf_dir")]
    pub conf_dir: PathBuf,
    /// Where plugin binaries are looked up, in order.
    #[serde(default = "default_cni_bin_dirs")]
    pub bin_dirs: Vec<PathBuf>,
}

impl Default for Cni {
    fn default() -> Self {
        Cni { conf_dir: default_cni_conf_dir(), bin_dirs: default_cni_bin_dirs() }
    }
}

fn default_cni_conf_dir() -> PathBuf {
    PathBuf::from(DEFAULT_CNI_CONF_DIR)
}

fn default_cni_bin_dirs() -> Vec<PathBuf> {
    DEFAULT_CNI_BIN_DIRS.iter().map(PathBuf::from).collect()
}

/// The file as written; [`Config::from_file`] validates it into a [`Config`].
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    socket: Option<PathBuf>,
    root: Option<PathBuf>,
    default_handler: Option<String>,
    #[serde(default)]
    handlers: BTreeMap<String, HandlerFile>,
    #[serde(default)]
    cni: Cni,
    #[serde(default)]
    registries: BTreeMap<String, RegistryHostFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HandlerFile {
    binary: PathBuf,
    #[serde(default)]
    args: Vec<String>,
    root: Option<PathBuf>,
    /// `shared-pod-namespaces` or `sandbox-per-container`; default from the binary.
    isolation: Option<String>,
    /// Capability names (`CAP_BPF` or `BPF`); default from the binary.
    unsupported_capabilities: Option<Vec<String>>,
    platform: Option<String>,
    #[serde(default)]
    os_version: String,
    #[serde(default)]
    os_features: Vec<String>,
    #[serde(default)]
    allowed_annotations: Vec<String>,
    /// As containerd: privileged pods are allowed unless a handler says otherwise.
    #[serde(default = "yes")]
    privileged: bool,
}

fn yes() -> bool {
    true
}

/// `RegistryHost` with unknown keys rejected (a misspelt `insecure` must not pass silently).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RegistryHostFile {
    #[serde(default)]
    mirrors: Vec<String>,
    #[serde(default)]
    insecure: bool,
    #[serde(default)]
    ca_files: Vec<PathBuf>,
}

impl Config {
    /// Loads `path`. A missing file is an error when `explicit` (the user named it), otherwise the
    /// defaults with the handlers found on PATH.
    pub fn load(path: &Path, explicit: bool) -> Result<Config, ConfigError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Config::from_toml(&text, &discovery_path()).map_err(|e| match e {
                ConfigError::Parse { source, .. } => ConfigError::Parse { path: path.to_owned(), source },
                other => other,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => Config::from_toml("", &discovery_path()),
            Err(source) => Err(ConfigError::Read { path: path.to_owned(), source }),
        }
    }

    /// Parses and validates a config file's text. `search_path` (a `PATH`-style list) is where
    /// handlers are discovered when the file configures none.
    pub fn from_toml(text: &str, search_path: &OsStr) -> Result<Config, ConfigError> {
        let file: File = toml::from_str(text)
            .map_err(|source| ConfigError::Parse { path: PathBuf::from("<text>"), source: Box::new(source) })?;
        Config::from_file(file, search_path)
    }

    fn from_file(file: File, search_path: &OsStr) -> Result<Config, ConfigError> {
        let socket = file.socket.unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
        let root = file.root.unwrap_or_else(|| PathBuf::from(DEFAULT_ROOT));
        for (key, path) in [("socket", &socket), ("root", &root)] {
            if !path.is_absolute() {
                return Err(invalid(key, format!("{} is not an absolute path", path.display())));
            }
        }

        let mut handlers = BTreeMap::new();
        for (name, h) in file.handlers {
            let handler = validate_handler(&name, h)?;
            handlers.insert(name, Arc::new(handler));
        }
        let discovered = handlers.is_empty();
        if discovered {
            handlers = discover_handlers(search_path);
            if handlers.is_empty() {
                return Err(ConfigError::NoHandlers);
            }
        }

        let default_handler = match file.default_handler {
            Some(name) => {
                if !handlers.contains_key(&name) {
                    let known: Vec<_> = handlers.keys().map(String::as_str).collect();
                    return Err(invalid(
                        "default_handler",
                        format!("{name:?} is not a configured handler (configured: {})", known.join(", ")),
                    ));
                }
                name
            }
            // Discovered handlers may lack runc; fall back to the first one found.
            None if discovered && !handlers.contains_key(DEFAULT_HANDLER) => KNOWN_RUNTIMES
                .iter()
                .map(|(n, ..)| n.to_string())
                .find(|n| handlers.contains_key(n))
                .unwrap_or_default(),
            None => {
                if !handlers.contains_key(DEFAULT_HANDLER) {
                    let known: Vec<_> = handlers.keys().map(String::as_str).collect();
                    return Err(invalid(
                        "default_handler",
                        format!(
                            "not set and no handler is named {DEFAULT_HANDLER:?} (configured: {})",
                            known.join(", ")
                        ),
                    ));
                }
                DEFAULT_HANDLER.to_string()
            }
        };

        let mut registries = BTreeMap::new();
        for (host, r) in file.registries {
            if host.is_empty() || host.contains('/') || host.contains(char::is_whitespace) {
                return Err(invalid(format!("registries.{host:?}"), "not a registry host (host[:port])"));
            }
            for (i, m) in r.mirrors.iter().enumerate() {
                if m.is_empty() || m.contains(char::is_whitespace) {
                    return Err(invalid(format!("registries.{host:?}.mirrors[{i}]"), format!("invalid mirror {m:?}")));
                }
            }
            registries.insert(host, RegistryHost { mirrors: r.mirrors, insecure: r.insecure, ca_files: r.ca_files });
        }

        Ok(Config { socket, root, default_handler, handlers, cni: file.cni, registries })
    }

    /// `""` means the default handler; unknown names give `None`.
    pub fn handler(&self, name: &str) -> Option<&Arc<RuntimeHandler>> {
        let name = if name.is_empty() { &self.default_handler } else { name };
        self.handlers.get(name)
    }

    /// Where the image store lives.
    pub fn images_root(&self) -> PathBuf {
        self.root.join("images")
    }

    /// What the image store needs from this config.
    pub fn images_config(&self) -> ImagesConfig {
        ImagesConfig {
            root: self.images_root(),
            handlers: self.handlers.iter().map(|(n, h)| (n.clone(), h.platform.clone())).collect(),
            default_handler: self.default_handler.clone(),
            registries: self.registries.clone(),
        }
    }
}

fn validate_handler(name: &str, h: HandlerFile) -> Result<RuntimeHandler, ConfigError> {
    if !is_dns_label(name) {
        return Err(invalid(
            format!("handlers.{name:?}"),
            "handler name must be a DNS label (lowercase letters, digits and '-', at most 63)",
        ));
    }
    let key = |field: &str| format!("handlers.{name}.{field}");
    if h.binary.as_os_str().is_empty() {
        return Err(invalid(key("binary"), "must not be empty"));
    }
    if h.binary.components().count() > 1 && !h.binary.is_absolute() {
        return Err(invalid(
            key("binary"),
            format!("{} must be a name on PATH or an absolute path", h.binary.display()),
        ));
    }
    if let Some(root) = &h.root
        && !root.is_absolute()
    {
        return Err(invalid(key("root"), format!("{} is not an absolute path", root.display())));
    }
    let isolation = match &h.isolation {
        Some(i) => Isolation::parse(i).ok_or_else(|| {
            let names: Vec<&str> = Isolation::NAMES.iter().map(|(n, _)| *n).collect();
            invalid(key("isolation"), format!("unknown isolation {i:?} (one of: {})", names.join(", ")))
        })?,
        None => Isolation::default_for(&h.binary),
    };
    let unsupported_capabilities = match &h.unsupported_capabilities {
        Some(names) => Some(
            names
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    berth_oci::spec::parse_capability(name).map_err(|_| {
                        let key = format!("{}[{i}]", key("unsupported_capabilities"));
                        invalid(key, format!("unknown capability {name:?}"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        None => None,
    };
    let gaps = runtime_gaps(&h.binary, unsupported_capabilities);
    let mut platform = match &h.platform {
        Some(p) => parse_platform(p).ok_or_else(|| invalid(key("platform"), format!("invalid platform {p:?}")))?,
        None => host_platform(),
    };
    if !h.os_version.is_empty() {
        platform.os_version = Some(h.os_version);
    }
    for (i, f) in h.os_features.iter().enumerate() {
        if f.is_empty() {
            return Err(invalid(format!("{}[{i}]", key("os_features")), "must not be empty"));
        }
    }
    platform.os_features = h.os_features;
    for (i, a) in h.allowed_annotations.iter().enumerate() {
        if a.is_empty() {
            return Err(invalid(format!("{}[{i}]", key("allowed_annotations")), "must not be empty"));
        }
    }
    Ok(RuntimeHandler {
        name: name.to_string(),
        oci: oci_runtime(&h.binary, &h.args, h.root.as_deref()),
        binary: h.binary,
        args: h.args,
        root: h.root,
        isolation,
        gaps,
        platform,
        allowed_annotations: h.allowed_annotations,
        privileged: h.privileged,
    })
}

/// The OCI runtime of a handler: its binary, global args and `--root`. A bare name is looked up on
/// PATH once here, not by every exec of it (each container start).
fn oci_runtime(binary: &Path, args: &[String], root: Option<&Path>) -> OciRuntime {
    let on_path = || std::env::var_os("PATH").and_then(|path| find_on_path(binary.to_str()?, &path));
    let bare_name = binary.components().count() == 1;
    let resolved = if bare_name { on_path().unwrap_or_else(|| binary.to_path_buf()) } else { binary.to_path_buf() };
    let mut rt = OciRuntime::new(resolved, Arc::new(ProcessSpawner)).with_global_args(runtime_args(binary, args));
    if let Some(root) = root {
        rt = rt.with_root(root);
    }
    rt
}

/// The global args a handler's runtime is run with: the configured ones, and for runsc
/// `--oci-seccomp` unless they set that flag themselves (`--oci-seccomp=false`). Without it runsc
/// ignores the spec's seccomp profile, so a container would run unconfined whatever it asked for.
fn runtime_args(binary: &Path, args: &[String]) -> Vec<String> {
    let mut out = args.to_vec();
    let names_oci_seccomp = args.iter().any(|a| a.trim_start_matches('-').split('=').next() == Some("oci-seccomp"));
    if is_runsc(binary) && !names_oci_seccomp {
        out.push("--oci-seccomp".to_owned());
    }
    out
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// `os/architecture[/variant]`, each part lowercase letters, digits, `_`, `.` or `-`, in its
/// canonical OCI spelling. Stricter than `Platform::parse`, which completes `linux` from the host:
/// a hand-written guest platform names both parts.
pub fn parse_platform(s: &str) -> Option<Platform> {
    let parts: Vec<&str> = s.split('/').collect();
    let ok = |p: &str| {
        !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b))
    };
    if !(2..=3).contains(&parts.len()) || !parts.iter().all(|p| ok(p)) {
        return None;
    }
    Platform::parse(s).ok()
}

/// The platform this process runs on, in OCI spelling.
pub fn host_platform() -> Platform {
    Platform::host()
}

fn discovery_path() -> std::ffi::OsString {
    std::env::var_os("PATH").unwrap_or_default()
}

/// runc, crun and runsc found in `search_path`, configured with their defaults.
fn discover_handlers(search_path: &OsStr) -> BTreeMap<String, Arc<RuntimeHandler>> {
    KNOWN_RUNTIMES
        .iter()
        .filter(|(_, binary, _)| find_on_path(binary, search_path).is_some())
        .map(|(name, binary, args)| {
            let binary = PathBuf::from(binary);
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            let handler = RuntimeHandler {
                name: name.to_string(),
                oci: oci_runtime(&binary, &args, None),
                isolation: Isolation::default_for(&binary),
                gaps: runtime_gaps(&binary, None),
                binary,
                args,
                root: None,
                platform: host_platform(),
                allowed_annotations: Vec::new(),
                privileged: true,
            };
            (name.to_string(), Arc::new(handler))
        })
        .collect()
}

/// The executable `name` in one of `search_path`'s directories.
pub fn find_on_path(name: &str, search_path: &OsStr) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(search_path)
        .map(|dir| dir.join(name))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml(text, OsStr::new(""))
    }

    fn err(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    const FULL: &str = r#"
socket = "/run/berth/test.sock"
root = "/var/lib/berth/test"
default_handler = "runc"
[handlers.runc]
binary = "runc"
[handlers.gvisor]
binary = "runsc"
args = ["--platform=ptrace", "--network=host"]
root = "/run/berth/runsc"
isolation = "sandbox-per-container"
unsupported_capabilities = ["CAP_BPF", "perfmon"]
platform = "linux/arm64/v8"
os_version = "10.0.17763"
os_features = ["win32k"]
allowed_annotations = ["dev.gvisor.*"]
privileged = false
[cni]
conf_dir = "/etc/cni/test.d"
bin_dirs = ["/opt/cni/bin"]
[registries."docker.io"]
mirrors = ["http://127.0.0.1:5000"]
[registries."127.0.0.1:5000"]
insecure = true
ca_files = ["/etc/ssl/extra.pem"]
"#;

    #[test]
    fn every_documented_key_is_read() {
        let c = parse(FULL).unwrap();
        assert_eq!(c.socket, Path::new("/run/berth/test.sock"));
        assert_eq!(c.root, Path::new("/var/lib/berth/test"));
        assert_eq!(c.default_handler, "runc");
        let g = &c.handlers["gvisor"];
        assert_eq!(g.binary, Path::new("runsc"));
        assert_eq!(g.args, ["--platform=ptrace", "--network=host"]);
        assert_eq!(g.root.as_deref(), Some(Path::new("/run/berth/runsc")));
        assert_eq!(g.isolation, Isolation::SandboxPerContainer);
        assert_eq!(g.gaps.unsupported_capabilities, [Capability::Bpf, Capability::Perfmon]);
        assert_eq!(
            g.platform,
            Platform {
                os: "linux".into(),
                architecture: "arm64".into(),
                variant: Some("v8".into()),
                os_version: Some("10.0.17763".into()),
                os_features: vec!["win32k".into()],
            }
        );
        assert_eq!(g.allowed_annotations, ["dev.gvisor.*"]);
        assert!(!g.privileged);
        assert_eq!(c.handlers["runc"].platform, host_platform());
        assert!(c.handlers["runc"].privileged, "privileged pods are allowed by default");
        assert_eq!(c.cni.conf_dir, Path::new("/etc/cni/test.d"));
        assert_eq!(c.cni.bin_dirs, [Path::new("/opt/cni/bin")]);
        assert_eq!(c.registries["docker.io"].mirrors, ["http://127.0.0.1:5000"]);
        assert!(c.registries["127.0.0.1:5000"].insecure);
        assert_eq!(c.registries["127.0.0.1:5000"].ca_files, [Path::new("/etc/ssl/extra.pem")]);
        assert_eq!(c.images_config().handlers["gvisor"], g.platform);
        assert_eq!(c.images_config().root, Path::new("/var/lib/berth/test/images"));
    }

    #[test]
    fn defaults_fill_what_the_file_leaves_out() {
        let c = parse("[handlers.runc]\nbinary = \"runc\"\n").unwrap();
        assert_eq!(c.socket, Path::new(DEFAULT_SOCKET));
        assert_eq!(c.root, Path::new(DEFAULT_ROOT));
        assert_eq!(c.default_handler, "runc");
        assert_eq!(c.cni, Cni::default());
        assert_eq!(c.cni.bin_dirs, [Path::new("/usr/lib/cni"), Path::new("/opt/cni/bin")]);
        assert!(c.registries.is_empty());
    }

    #[test]
    fn empty_handler_name_means_the_default_handler() {
        let c = parse(FULL).unwrap();
        assert_eq!(c.handler("").unwrap().name, "runc");
        assert_eq!(c.handler("gvisor").unwrap().name, "gvisor");
        assert!(c.handler("kata").is_none());
    }

    #[test]
    fn invalid_platform_names_the_key() {
        let text = "[handlers.runc]\nbinary = \"runc\"\n[handlers.gvisor]\nbinary = \"runsc\"\nplatform = \"linux\"\n";
        assert_eq!(err(text), r#"handlers.gvisor.platform: invalid platform "linux""#);
        let text = "[handlers.runc]\nbinary = \"runc\"\nplatform = \"linux/amd64/v1/x\"\n";
        assert_eq!(err(text), r#"handlers.runc.platform: invalid platform "linux/amd64/v1/x""#);
        let text = "[handlers.runc]\nbinary = \"runc\"\nplatform = \"Linux/amd64\"\n";
        assert!(err(text).starts_with("handlers.runc.platform: "));
    }

    #[test]
    fn isolation_defaults_from_the_binary_and_the_key_overrides_it() {
        let c = parse(
            r#"
[handlers.runc]
binary = "runc"
[handlers.gvisor]
binary = "/opt/gvisor/bin/runsc"
[handlers.vm]
binary = "/usr/local/bin/vm-runtime"
isolation = "sandbox-per-container"
[handlers.shared]
binary = "runsc"
isolation = "shared-pod-namespaces"
"#,
        )
        .unwrap();
        let isolation = |name: &str| c.handler(name).unwrap().isolation;
        assert_eq!(isolation("runc"), Isolation::SharedPodNamespaces);
        assert_eq!(isolation("gvisor"), Isolation::SandboxPerContainer);
        assert_eq!(isolation("vm"), Isolation::SandboxPerContainer);
        assert_eq!(isolation("shared"), Isolation::SharedPodNamespaces);
        assert_eq!(
            err("[handlers.runc]\nbinary = \"runc\"\nisolation = \"vm\"\n"),
            r#"handlers.runc.isolation: unknown isolation "vm" (one of: shared-pod-namespaces, sandbox-per-container)"#
        );
    }

    #[test]
    fn runsc_handlers_work_around_what_gvisor_2022_does_not_do_and_the_capabilities_are_configurable() {
        let c = parse(
            r#"
[handlers.runc]
binary = "runc"
[handlers.gvisor]
binary = "/opt/gvisor/bin/runsc"
[handlers.gvisor-new]
binary = "runsc"
unsupported_capabilities = []
[handlers.vm]
binary = "vm-runtime"
unsupported_capabilities = ["SYS_ADMIN", "cap_bpf"]
"#,
        )
        .unwrap();
        let unsupported = |name: &str| c.handler(name).unwrap().gaps.unsupported_capabilities.clone();
        assert_eq!(unsupported("runc"), []);
        assert_eq!(unsupported("gvisor"), [Capability::Perfmon, Capability::Bpf, Capability::CheckpointRestore]);
        assert_eq!(unsupported("gvisor-new"), []);
        assert_eq!(unsupported("vm"), [Capability::SysAdmin, Capability::Bpf]);
        let emulates_paths = |name: &str| c.handler(name).unwrap().gaps.ignores_masked_and_readonly_paths;
        assert!(emulates_paths("gvisor") && emulates_paths("gvisor-new"), "runsc ignores masked and read-only paths");
        assert!(!emulates_paths("runc") && !emulates_paths("vm"));
    }

    #[test]
    fn an_unknown_unsupported_capability_names_its_key() {
        let text = "[handlers.runc]\nbinary = \"runc\"\nunsupported_capabilities = [\"BPF\", \"FLY\"]\n";
        assert_eq!(err(text), r#"handlers.runc.unsupported_capabilities[1]: unknown capability "FLY""#);
    }

    #[test]
    fn a_runsc_handler_enforces_the_specs_seccomp_profile_unless_its_args_say_otherwise() {
        let c = parse(
            r#"
[handlers.runc]
binary = "/bin/true"
args = ["--debug"]
[handlers.gvisor]
binary = "/usr/bin/runsc"
args = ["--platform=ptrace"]
[handlers.gvisor-unconfined]
binary = "/usr/bin/runsc"
args = ["-oci-seccomp=false"]
"#,
        )
        .unwrap();
        let args = |name: &str| c.handlers[name].oci().global_args().to_vec();
        assert_eq!(args("runc"), ["--debug"]);
        assert_eq!(args("gvisor"), ["--platform=ptrace", "--oci-seccomp"]);
        assert_eq!(c.handlers["gvisor"].args, ["--platform=ptrace"], "the configured args stay as written");
        assert_eq!(args("gvisor-unconfined"), ["-oci-seccomp=false"]);
    }

    #[test]
    fn a_handlers_oci_runtime_is_resolved_once_with_its_args_and_root() {
        let text = "[handlers.runc]\nbinary = \"/bin/true\"\nargs = [\"--debug\"]\nroot = \"/run/x\"\n\
                    [handlers.sh]\nbinary = \"sh\"\n";
        let c = parse(text).unwrap();
        let runc = c.handler("").unwrap().oci();
        assert_eq!(runc.binary(), Path::new("/bin/true"));
        assert_eq!(runc.global_args(), ["--debug"]);
        assert_eq!(runc.root(), Some(Path::new("/run/x")));
        let sh = &c.handlers["sh"];
        assert_eq!(sh.binary, Path::new("sh"), "the configured name stays as written");
        assert!(sh.oci().binary().is_absolute(), "a bare name is found on PATH: {}", sh.oci().binary().display());
    }

    #[test]
    fn default_handler_must_be_configured() {
        let text = "default_handler = \"kata\"\n[handlers.runc]\nbinary = \"runc\"\n";
        assert_eq!(err(text), r#"default_handler: "kata" is not a configured handler (configured: runc)"#);
        let text = "[handlers.crun]\nbinary = \"crun\"\n";
        assert!(err(text).starts_with("default_handler: not set"), "{}", err(text));
        let c = parse("default_handler = \"crun\"\n[handlers.crun]\nbinary = \"crun\"\n").unwrap();
        assert_eq!(c.default_handler, "crun");
    }

    #[test]
    fn bad_values_name_their_key() {
        assert_eq!(err("socket = \"run/x.sock\"\n"), "socket: run/x.sock is not an absolute path");
        assert_eq!(err("root = \"x\"\n"), "root: x is not an absolute path");
        assert!(err("[handlers.Runc]\nbinary = \"runc\"\n").starts_with(r#"handlers."Runc": handler name"#));
        assert_eq!(err("[handlers.runc]\nbinary = \"\"\n"), "handlers.runc.binary: must not be empty");
        assert_eq!(
            err("[handlers.runc]\nbinary = \"bin/runc\"\n"),
            "handlers.runc.binary: bin/runc must be a name on PATH or an absolute path"
        );
        assert_eq!(
            err("[handlers.runc]\nbinary = \"runc\"\nroot = \"state\"\n"),
            "handlers.runc.root: state is not an absolute path"
        );
        let text = "[handlers.runc]\nbinary = \"runc\"\n[registries.\"docker.io\"]\nmirrors = [\"\"]\n";
        assert_eq!(err(text), r#"registries."docker.io".mirrors[0]: invalid mirror """#);
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_rejected() {
        let e = parse("[handlers.runc]\nbinary = \"runc\"\nprivilegd = true\n").unwrap_err();
        assert!(matches!(e, ConfigError::Parse { .. }));
        assert!(std::error::Error::source(&e).unwrap().to_string().contains("privilegd"));
        let e = parse("[handlers.runc]\nbinary = \"runc\"\n[registries.\"docker.io\"]\ninsecur = true\n").unwrap_err();
        assert!(std::error::Error::source(&e).unwrap().to_string().contains("insecur"));
        assert!(matches!(parse("socket = 3\n").unwrap_err(), ConfigError::Parse { .. }));
    }

    fn fake_path(binaries: &[&str]) -> tempfile::TempDir {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        for b in binaries {
            let p = dir.path().join(b);
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        dir
    }

    #[test]
    fn handlers_found_on_path_are_configured_when_the_file_names_none() {
        let dir = fake_path(&["runc", "runsc"]);
        std::fs::write(dir.path().join("crun"), "not executable").unwrap();
        let c = Config::from_toml("", dir.path().as_os_str()).unwrap();
        assert_eq!(c.handlers.keys().collect::<Vec<_>>(), ["gvisor", "runc"]);
        assert_eq!(c.default_handler, "runc");
        assert_eq!(c.handlers["gvisor"].binary, Path::new("runsc"));
        assert_eq!(c.handlers["gvisor"].args, ["--platform=ptrace", "--network=host"]);
        assert_eq!(c.handlers["gvisor"].platform, host_platform());
        assert_eq!(c.handlers["gvisor"].isolation, Isolation::SandboxPerContainer);
        assert_eq!(c.handlers["gvisor"].gaps.unsupported_capabilities.len(), 3);
        assert_eq!(c.handlers["runc"].gaps, RuntimeGaps::default());
        assert!(c.handlers["runc"].args.is_empty());
        assert_eq!(c.handlers["runc"].isolation, Isolation::SharedPodNamespaces);
    }

    #[test]
    fn discovery_without_runc_defaults_to_the_first_runtime_found() {
        let dir = fake_path(&["crun", "runsc"]);
        let c = Config::from_toml("", dir.path().as_os_str()).unwrap();
        assert_eq!(c.default_handler, "crun");
        let dir = fake_path(&[]);
        assert!(matches!(Config::from_toml("", dir.path().as_os_str()), Err(ConfigError::NoHandlers)));
    }

    #[test]
    fn a_missing_file_is_fine_only_at_the_default_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("runtime.toml");
        assert!(matches!(Config::load(&missing, true), Err(ConfigError::Read { .. })));
        // Not explicit: discovery on the real PATH, which may or may not hold a runtime.
        match Config::load(&missing, false) {
            Ok(c) => assert!(c.handler("").is_some()),
            Err(e) => assert!(matches!(e, ConfigError::NoHandlers)),
        }
        std::fs::write(&missing, "socket = [\n").unwrap();
        match Config::load(&missing, true) {
            Err(ConfigError::Parse { path, .. }) => assert_eq!(path, missing),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn platforms_parse_as_os_arch_and_optional_variant() {
        let p = parse_platform("linux/arm/v7").unwrap();
        assert_eq!((p.os.as_str(), p.architecture.as_str(), p.variant.as_deref()), ("linux", "arm", Some("v7")));
        assert_eq!(parse_platform("windows/amd64").unwrap().variant, None);
        for bad in ["", "linux", "linux/", "/amd64", "linux//v7", "linux/amd64/v7/x", "linux/AMD64"] {
            assert!(parse_platform(bad).is_none(), "{bad}");
        }
    }
}
