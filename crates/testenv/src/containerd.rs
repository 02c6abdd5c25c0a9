//! containerd 1.6 (Debian's `/usr/bin/containerd`) with its CRI plugin, the reference CRI runtime
//! berth runs beside and is measured against: config, root, state, socket and a CNI bridge
//! network of its own in a temp dir; images from loopback registries over plain HTTP, the first
//! of them also standing in for `registry.k8s.io` (the sandbox image's registry). Stopped on drop,
//! and whatever its pods left on the host (containers, shims, mounts, the bridge) is removed then,
//! and also when the test process dies without dropping it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cni::{BridgeNetwork, CNI_BIN_DIR};
use crate::daemon::{Daemon, require_binary};

pub const CONTAINERD_BIN: &str = "/usr/bin/containerd";
/// The sandbox image every containerd pod runs; `Registry::push_pause()` provides it.
pub const SANDBOX_IMAGE: &str = "registry.k8s.io/pause:3.9";
/// The registry [`SANDBOX_IMAGE`] comes from, resolved through the first configured registry.
const SANDBOX_REGISTRY: &str = "registry.k8s.io";

const TEMPLATE: &str = include_str!("../assets/containerd-config.toml.in");
const RUNSC_WRAPPER: &str = include_str!("../assets/runsc-cri.sh");

/// One runtime handler: the containerd runtime `name`, run by the runc v2 shim with `binary`;
/// `cli` lists and kills its leftover containers (runsc behind the gvisor wrapper).
#[derive(Clone, Debug)]
struct Handler {
    name: String,
    binary: String,
    cli: String,
}

/// Options for [`Containerd`].
#[derive(Clone, Debug)]
pub struct ContainerdBuilder {
    binary: PathBuf,
    registries: Vec<String>,
    handlers: Vec<Handler>,
    network: Option<BridgeNetwork>,
}

impl Default for ContainerdBuilder {
    /// Handlers `runc` (the default), `crun` and `gvisor` (runsc on ptrace in the pod's netns).
    fn default() -> Self {
        let handler =
            |name: &str, binary: &str, cli: &str| Handler { name: name.into(), binary: binary.into(), cli: cli.into() };
        ContainerdBuilder {
            binary: CONTAINERD_BIN.into(),
            registries: Vec::new(),
            handlers: vec![
                handler("runc", "runc", "runc"),
                handler("crun", "crun", "crun"),
                handler("gvisor", "{{DIR}}/bin/runsc-cri", "runsc"),
            ],
            network: None,
        }
    }
}

impl ContainerdBuilder {
    /// Another containerd binary than Debian's.
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = path.into();
        self
    }

    /// A registry host (`127.0.0.1:PORT`) pulled from over plain HTTP. The first one also serves
    /// `registry.k8s.io`, so it must hold `pause:3.9` ([`SANDBOX_IMAGE`]).
    pub fn registry(mut self, host: &str) -> Self {
        self.registries.push(host.into());
        self
    }

    /// One more handler: a runc-compatible `binary` (`runc`, `crun`, or a path) under the name
    /// `name`, e.g. `.handler("ctd-runc", "runc")`.
    pub fn handler(mut self, name: &str, binary: &str) -> Self {
        self.handlers.push(Handler { name: name.into(), binary: binary.into(), cli: binary.into() });
        self
    }

    /// The pods' CNI network; default: [`BridgeNetwork::unique`] in 10.200–10.231. The bridge is
    /// deleted when containerd stops.
    pub fn network(mut self, network: BridgeNetwork) -> Self {
        self.network = Some(network);
        self
    }

    /// The config file for an instance in `dir`.
    pub fn render_config(&self, dir: &Path) -> String {
        let mut runtimes = String::new();
        for h in &self.handlers {
            let table = format!(r#"plugins."io.containerd.grpc.v1.cri".containerd.runtimes."{}""#, h.name);
            runtimes.push_str(&format!(
                "      [{table}]\n        runtime_type = \"io.containerd.runc.v2\"\n        [{table}.options]\n          \
                 BinaryName = \"{}\"\n          Root = \"{{{{DIR}}}}/oci/{}\"\n          SystemdCgroup = false\n\n",
                h.binary, h.name
            ));
        }
        TEMPLATE
            .replace("{{RUNTIMES}}", runtimes.trim_end())
            .replace("{{DIR}}", &dir.to_string_lossy())
            .replace("{{CNI_BIN}}", CNI_BIN_DIR)
            .replace("{{SANDBOX_IMAGE}}", SANDBOX_IMAGE)
    }

    /// Starts containerd and waits until it has booted. Panics with its log if it does not, and
    /// with install advice if a binary is missing.
    pub fn start(self) -> Containerd {
        require_binary(&self.binary.to_string_lossy(), "containerd");
        require_binary("/usr/sbin/runc", "runc");
        require_binary(&format!("{CNI_BIN_DIR}/bridge"), "containernetworking-plugins");
        let dir = tempfile::Builder::new().prefix("berth-testenv-containerd.").tempdir().expect("tempdir");
        let path = dir.path();
        for sub in ["root", "state", "opt", "oci", "bin", "certs.d"] {
            std::fs::create_dir_all(path.join(sub)).expect("containerd dirs");
        }
        let wrapper = path.join("bin/runsc-cri");
        std::fs::write(&wrapper, RUNSC_WRAPPER).expect("write runsc-cri");
        std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        for host in &self.registries {
            let local = format!("http://{host}");
            write_hosts_toml(path, host, &local, &local);
        }
        if let Some(first) = self.registries.first() {
            write_hosts_toml(
                path,
                SANDBOX_REGISTRY,
                &format!("https://{SANDBOX_REGISTRY}"),
                &format!("http://{first}"),
            );
        }
        let network = self.network.clone().unwrap_or_else(|| BridgeNetwork::unique("ctd", 200, 32));
        network.write_conflist(&path.join("net.d"), &path.join("ipam")).expect("write the conflist");
        let config = path.join("containerd.toml");
        std::fs::write(&config, self.render_config(path)).expect("write containerd.toml");
        let after_exit = path.join("after-exit.sh");
        std::fs::write(&after_exit, after_exit_script(path, &network.bridge, &self.handlers)).expect("after-exit.sh");

        let daemon = Daemon::spawn_with_after_exit(
            &self.binary.to_string_lossy(),
            &["--config".into(), config.display().to_string()],
            &path.join("containerd.log"),
            Some(path),
            Some(&after_exit),
        );
        let containerd =
            Containerd { handlers: self.handlers.iter().map(|h| h.name.clone()).collect(), network, daemon, dir };
        containerd.wait_booted();
        containerd
    }
}

/// `certs.d/<host>/hosts.toml`: pull and resolve `host`'s images from `endpoint`.
fn write_hosts_toml(dir: &Path, host: &str, server: &str, endpoint: &str) {
    let path = dir.join("certs.d").join(host);
    std::fs::create_dir_all(&path).expect("certs.d");
    // containerd 1.6 ignores a hosts.toml without a [host] table.
    let text = format!(
        "server = \"{server}\"\n\n[host.\"{endpoint}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  skip_verify = true\n"
    );
    std::fs::write(path.join("hosts.toml"), text).expect("write hosts.toml");
}

/// Run by the watchdog once containerd has exited, however it ended: kills and deletes the
/// containers still in the handlers' state roots, kills this instance's shims (found by its
/// socket in their command line), unmounts everything under `dir` and deletes the bridge.
fn after_exit_script(dir: &Path, bridge: &str, handlers: &[Handler]) -> String {
    let mut script = format!(
        r#"# containerd has exited: remove what its pods left. Every step names only this instance's paths.
dir='{dir}'
bridge='{bridge}'
left=0
# The runc shim gives the OCI runtime the handler's root plus the containerd namespace.
kill_containers() {{
  for root in "$2"/*/; do
    [ -d "$root" ] || continue
    for id in $("$1" --root "$root" list --quiet 2>/dev/null); do
      "$1" --root "$root" kill "$id" KILL >/dev/null 2>&1
      "$1" --root "$root" delete --force "$id" >/dev/null 2>&1
      left=$((left + 1))
    done
  done
}}
"#,
        dir = dir.display()
    );
    for h in handlers {
        script.push_str(&format!("kill_containers '{}' \"$dir/oci/{}\"\n", h.cli, h.name));
    }
    script.push_str(
        r#"for p in /proc/[0-9]*; do
  case $(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) in
    *containerd-shim*" -address $dir/containerd.sock "*) kill -9 "${p#/proc/}" 2>/dev/null ;;
  esac
done
awk -v d="$dir/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r | while read -r m; do
  umount -l "$m"
done
if ip link show "$bridge" >/dev/null 2>&1; then ip link del "$bridge"; fi
[ "$left" -eq 0 ] || echo "berth-testenv: killed $left container(s) containerd left running"
"#,
    );
    script
}

/// A running containerd; stopped on drop, its pods' leftovers removed and its temp dir deleted.
pub struct Containerd {
    handlers: Vec<String>,
    network: BridgeNetwork,
    // Dropped in this order: containerd stops (and its leftovers go) before its temp dir does.
    daemon: Daemon,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for Containerd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Containerd").field("dir", &self.dir.path()).field("handlers", &self.handlers).finish()
    }
}

impl Containerd {
    pub fn builder() -> ContainerdBuilder {
        ContainerdBuilder::default()
    }

    /// Handlers runc, crun and gvisor, images from `registry_host` (which also serves the pause
    /// image as `registry.k8s.io/pause:3.9`).
    pub fn start(registry_host: &str) -> Containerd {
        Containerd::builder().registry(registry_host).start()
    }

    fn wait_booted(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let log = self.log();
            if let Some(line) =
                log.lines().find(|l| l.contains("failed to load plugin") && l.contains("io.containerd.grpc.v1.cri"))
            {
                panic!(
                    "containerd runs without its CRI plugin: {line}\nconfig: {}",
                    self.dir().join("containerd.toml").display()
                );
            }
            if log.contains("containerd successfully booted")
                && std::os::unix::net::UnixStream::connect(self.socket()).is_ok()
            {
                return;
            }
            assert!(self.daemon.running(), "containerd exited at start:\n{}", self.log_tail(30));
            assert!(Instant::now() < deadline, "containerd did not boot within 60 s:\n{}", self.log_tail(30));
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The CRI (and containerd API) socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }
    /// `unix:///…/containerd.sock`, for a CRI client or an agent's endpoint.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket().display())
    }
    /// The runtime handlers it serves, in config order (containerd 1.6's CRI Status lists none).
    pub fn handlers(&self) -> &[String] {
        &self.handlers
    }
    /// Its pods' network: bridge and subnet.
    pub fn network(&self) -> &BridgeNetwork {
        &self.network
    }
    /// The temp dir: `containerd.toml`, `containerd.log`, `root/`, `state/`, `net.d/`, `certs.d/`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
    /// containerd's own pid, e.g. for its memory use.
    pub fn pid(&self) -> u32 {
        self.daemon.pid()
    }
    pub fn log(&self) -> String {
        self.daemon.log()
    }
    /// The last `lines` lines of the log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        self.daemon.log_tail(lines)
    }
    /// Stops containerd now and removes what its pods left; the temp dir stays until drop.
    pub fn stop(&mut self) {
        self.daemon.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_names_only_the_instances_own_paths_and_every_handler() {
        let text = Containerd::builder().handler("ctd-runc", "runc").render_config(Path::new("/tmp/run-x"));
        assert!(!text.contains("{{"), "every placeholder is filled");
        assert!(text.contains(r#"address = "/tmp/run-x/containerd.sock""#));
        assert!(text.contains(r#"BinaryName = "/tmp/run-x/bin/runsc-cri""#));
        assert!(text.contains(r#"Root = "/tmp/run-x/oci/ctd-runc""#));
        assert!(text.contains(r#"containerd.runtimes."ctd-runc".options]"#));
        assert!(text.contains("restrict_oom_score_adj = true"));
        assert!(text.contains(r#"sandbox_image = "registry.k8s.io/pause:3.9""#));
    }

    #[test]
    fn the_after_exit_script_cleans_every_handlers_root_and_only_this_instances_shims() {
        let handlers = ContainerdBuilder::default().handler("ctd-runc", "runc").handlers;
        let script = after_exit_script(Path::new("/tmp/run-x"), "ctd1", &handlers);
        assert!(script.contains("kill_containers 'runsc' \"$dir/oci/gvisor\""));
        assert!(script.contains("kill_containers 'runc' \"$dir/oci/ctd-runc\""));
        assert!(script.contains("dir='/tmp/run-x'"));
        assert!(script.contains(r#"" -address $dir/containerd.sock ""#));
    }
}
