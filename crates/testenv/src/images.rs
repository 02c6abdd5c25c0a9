//! Image building in pure Rust: layer tarballs from in-memory entries, compression, digests and
//! diff_ids, image configs, manifests and indexes in OCI and Docker schema 2 media types.
//!
//! Everything is deterministic (fixed mtimes, sorted nothing behind the caller's back, compact
//! JSON in a fixed key order), so the same inputs always give the same digests.

use std::collections::BTreeMap;
use std::io::Write;

use bytes::Bytes;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The mtime of every tar entry and the `created` of every config: fixed, for stable digests.
pub const EPOCH: u64 = 1_704_067_200; // 2024-01-01T00:00:00Z
const CREATED: &str = "2024-01-01T00:00:00Z";

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const OCI_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
pub const DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar";
pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";

/// `sha256:<hex>` of some bytes.
pub fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// Which family of media types a manifest, its config and its layers use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    Oci,
    /// Docker v2 schema 2 (manifest lists for indexes). Has no zstd layer type.
    Docker,
}

impl Format {
    pub fn manifest_media_type(self) -> &'static str {
        match self {
            Format::Oci => OCI_MANIFEST,
            Format::Docker => DOCKER_MANIFEST,
        }
    }
    pub fn index_media_type(self) -> &'static str {
        match self {
            Format::Oci => OCI_INDEX,
            Format::Docker => DOCKER_LIST,
        }
    }
    pub fn config_media_type(self) -> &'static str {
        match self {
            Format::Oci => OCI_CONFIG,
            Format::Docker => DOCKER_CONFIG,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// The layer media type for this compression in `format`. Panics for zstd in Docker format.
    pub fn layer_media_type(self, format: Format) -> &'static str {
        match (format, self) {
            (Format::Oci, Compression::None) => OCI_LAYER,
            (Format::Oci, Compression::Gzip) => OCI_LAYER_GZIP,
            (Format::Oci, Compression::Zstd) => OCI_LAYER_ZSTD,
            (Format::Docker, Compression::None) => DOCKER_LAYER,
            (Format::Docker, Compression::Gzip) => DOCKER_LAYER_GZIP,
            (Format::Docker, Compression::Zstd) => {
                panic!("Docker schema 2 has no zstd layer media type; use Format::Oci")
            }
        }
    }

    /// Compresses `data`. Gzip and zstd at fast levels: test data, not archives.
    pub fn compress(self, data: &[u8]) -> Vec<u8> {
        match self {
            Compression::None => data.to_vec(),
            Compression::Gzip => {
                // Level 1: the 100 MB benchmark image is incompressible and would only get slower.
                let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                enc.write_all(data).expect("gzip into memory");
                enc.finish().expect("gzip into memory")
            }
            Compression::Zstd => zstd::encode_all(data, 1).expect("zstd into memory"),
        }
    }
}

/// One entry of a layer tarball. Paths are relative to the rootfs (a leading `/` is dropped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    Dir {
        path: String,
        mode: u32,
        uid: u64,
        gid: u64,
    },
    File {
        path: String,
        data: Bytes,
        mode: u32,
        uid: u64,
        gid: u64,
    },
    Symlink {
        path: String,
        target: String,
    },
    /// `path` becomes a hard link to `target` (a path earlier in the same layer).
    Hardlink {
        path: String,
        target: String,
    },
    /// Deletes `path` from the layers below (`<dir>/.wh.<name>`).
    Whiteout {
        path: String,
    },
    /// Hides everything the layers below have in `dir` (`<dir>/.wh..wh..opq`).
    Opaque {
        dir: String,
    },
}

/// Collects entries in order and turns them into a [`Layer`].
#[derive(Clone, Debug, Default)]
pub struct LayerBuilder {
    pub entries: Vec<Entry>,
}

fn rel(path: &str) -> String {
    path.trim_start_matches('/').trim_end_matches('/').to_owned()
}

impl LayerBuilder {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn entry(mut self, e: Entry) -> Self {
        self.entries.push(e);
        self
    }
    /// A directory owned by root.
    pub fn dir(self, path: &str, mode: u32) -> Self {
        self.dir_owned(path, mode, 0, 0)
    }
    pub fn dir_owned(self, path: &str, mode: u32, uid: u64, gid: u64) -> Self {
        self.entry(Entry::Dir { path: rel(path), mode, uid, gid })
    }
    /// A regular file owned by root.
    pub fn file(self, path: &str, data: impl Into<Bytes>, mode: u32) -> Self {
        self.file_owned(path, data, mode, 0, 0)
    }
    pub fn file_owned(self, path: &str, data: impl Into<Bytes>, mode: u32, uid: u64, gid: u64) -> Self {
        self.entry(Entry::File { path: rel(path), data: data.into(), mode, uid, gid })
    }
    pub fn symlink(self, path: &str, target: &str) -> Self {
        self.entry(Entry::Symlink { path: rel(path), target: target.to_owned() })
    }
    pub fn hardlink(self, path: &str, target: &str) -> Self {
        self.entry(Entry::Hardlink { path: rel(path), target: rel(target) })
    }
    pub fn whiteout(self, path: &str) -> Self {
        self.entry(Entry::Whiteout { path: rel(path) })
    }
    pub fn opaque(self, dir: &str) -> Self {
        self.entry(Entry::Opaque { dir: rel(dir) })
    }

    /// The uncompressed tarball (GNU headers, so long names and links work).
    pub fn tar(&self) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for e in &self.entries {
            match e {
                Entry::Dir { path, mode, uid, gid } => {
                    let mut h = header(tar::EntryType::Directory, *mode, *uid, *gid, 0);
                    b.append_data(&mut h, format!("{path}/"), std::io::empty()).expect("tar dir");
                }
                Entry::File { path, data, mode, uid, gid } => {
                    let mut h = header(tar::EntryType::Regular, *mode, *uid, *gid, data.len() as u64);
                    b.append_data(&mut h, path, &data[..]).expect("tar file");
                }
                Entry::Symlink { path, target } => {
                    let mut h = header(tar::EntryType::Symlink, 0o777, 0, 0, 0);
                    b.append_link(&mut h, path, target).expect("tar symlink");
                }
                Entry::Hardlink { path, target } => {
                    let mut h = header(tar::EntryType::Link, 0o644, 0, 0, 0);
                    b.append_link(&mut h, path, target).expect("tar hardlink");
                }
                Entry::Whiteout { path } => {
                    let (dir, name) = match path.rsplit_once('/') {
                        Some((d, n)) => (format!("{d}/"), n),
                        None => (String::new(), path.as_str()),
                    };
                    let mut h = header(tar::EntryType::Regular, 0o644, 0, 0, 0);
                    b.append_data(&mut h, format!("{dir}.wh.{name}"), std::io::empty()).expect("tar whiteout");
                }
                Entry::Opaque { dir } => {
                    let mut h = header(tar::EntryType::Regular, 0o644, 0, 0, 0);
                    let p = if dir.is_empty() { ".wh..wh..opq".to_owned() } else { format!("{dir}/.wh..wh..opq") };
                    b.append_data(&mut h, p, std::io::empty()).expect("tar opaque");
                }
            }
        }
        b.into_inner().expect("tar into memory")
    }

    pub fn build(&self, compression: Compression) -> Layer {
        Layer::from_tar(&self.tar(), compression)
    }
}

fn header(kind: tar::EntryType, mode: u32, uid: u64, gid: u64, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(uid);
    h.set_gid(gid);
    h.set_size(size);
    h.set_mtime(EPOCH);
    h
}

/// A layer blob as the registry stores it, with its digests.
#[derive(Clone, Debug)]
pub struct Layer {
    pub compression: Compression,
    /// The bytes pushed to the registry (compressed unless `Compression::None`).
    pub blob: Bytes,
    /// `sha256:` of `blob`: the manifest's layer digest.
    pub digest: String,
    /// `sha256:` of the uncompressed tar: the config's `rootfs.diff_ids` entry.
    pub diff_id: String,
    pub uncompressed_size: u64,
}

impl Layer {
    pub fn from_tar(tar: &[u8], compression: Compression) -> Layer {
        let blob = Bytes::from(compression.compress(tar));
        Layer {
            compression,
            digest: sha256_digest(&blob),
            diff_id: sha256_digest(tar),
            uncompressed_size: tar.len() as u64,
            blob,
        }
    }
    pub fn size(&self) -> u64 {
        self.blob.len() as u64
    }
}

/// An OCI platform. `Display`/`parse` use `os/arch[/variant]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
    pub os_version: Option<String>,
    pub os_features: Vec<String>,
}

impl Platform {
    pub fn new(os: &str, architecture: &str) -> Self {
        Platform { os: os.into(), architecture: architecture.into(), ..Default::default() }
    }
    pub fn with_variant(mut self, v: &str) -> Self {
        self.variant = Some(v.into());
        self
    }
    pub fn with_os_version(mut self, v: &str) -> Self {
        self.os_version = Some(v.into());
        self
    }
    /// `linux/amd64`, `linux/arm64/v8`, ...
    pub fn parse(s: &str) -> Platform {
        let mut it = s.split('/');
        let os = it.next().unwrap_or_default();
        let arch = it.next().unwrap_or_else(|| panic!("platform {s:?} is not os/arch[/variant]"));
        let p = Platform::new(os, arch);
        match it.next() {
            Some(v) => p.with_variant(v),
            None => p,
        }
    }
    /// The platform of the machine running the tests, in GOARCH names.
    pub fn host() -> Platform {
        match std::env::consts::ARCH {
            "x86_64" => Platform::new("linux", "amd64"),
            "aarch64" => Platform::new("linux", "arm64").with_variant("v8"),
            "arm" => Platform::new("linux", "arm").with_variant("v7"),
            "x86" => Platform::new("linux", "386"),
            other => Platform::new("linux", other),
        }
    }
    /// The descriptor `platform` object of an index entry.
    pub fn to_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        m.insert("architecture".into(), json!(self.architecture));
        m.insert("os".into(), json!(self.os));
        if let Some(v) = &self.os_version {
            m.insert("os.version".into(), json!(v));
        }
        if !self.os_features.is_empty() {
            m.insert("os.features".into(), json!(self.os_features));
        }
        if let Some(v) = &self.variant {
            m.insert("variant".into(), json!(v));
        }
        Value::Object(m)
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        if let Some(v) = &self.os_version {
            write!(f, " ({v})")?;
        }
        Ok(())
    }
}

/// The runtime part of an image config (`config` in the JSON).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerConfig {
    pub cmd: Option<Vec<String>>,
    pub entrypoint: Option<Vec<String>>,
    pub env: Vec<String>,
    pub user: Option<String>,
    pub working_dir: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// `80/tcp`, ...
    pub exposed_ports: Vec<String>,
    pub stop_signal: Option<String>,
}

/// The usual PATH of Linux images.
pub const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl ContainerConfig {
    /// `Cmd` = `cmd`, `Env` = the default PATH.
    pub fn cmd(cmd: &[&str]) -> Self {
        ContainerConfig {
            cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
            env: vec![DEFAULT_PATH.into()],
            ..Default::default()
        }
    }

    fn to_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        if let Some(u) = &self.user {
            m.insert("User".into(), json!(u));
        }
        if !self.exposed_ports.is_empty() {
            let ports: serde_json::Map<String, Value> =
                self.exposed_ports.iter().map(|p| (p.clone(), json!({}))).collect();
            m.insert("ExposedPorts".into(), Value::Object(ports));
        }
        if !self.env.is_empty() {
            m.insert("Env".into(), json!(self.env));
        }
        if let Some(e) = &self.entrypoint {
            m.insert("Entrypoint".into(), json!(e));
        }
        if let Some(c) = &self.cmd {
            m.insert("Cmd".into(), json!(c));
        }
        if let Some(w) = &self.working_dir {
            m.insert("WorkingDir".into(), json!(w));
        }
        if !self.labels.is_empty() {
            m.insert("Labels".into(), json!(self.labels));
        }
        if let Some(s) = &self.stop_signal {
            m.insert("StopSignal".into(), json!(s));
        }
        Value::Object(m)
    }
}

/// A complete single-platform image: layers, config blob and manifest, with their digests.
#[derive(Clone, Debug)]
pub struct Image {
    pub format: Format,
    pub platform: Platform,
    pub config: ContainerConfig,
    pub layers: Vec<Layer>,
    /// The config blob bytes (identical in both formats) and its digest: the image ID.
    pub config_json: Bytes,
    pub config_digest: String,
    pub manifest_json: Bytes,
    pub manifest_digest: String,
}

impl Image {
    pub fn build(format: Format, platform: Platform, config: ContainerConfig, layers: Vec<Layer>) -> Image {
        let mut cfg = serde_json::Map::new();
        cfg.insert("created".into(), json!(CREATED));
        cfg.insert("architecture".into(), json!(platform.architecture));
        if let Some(v) = &platform.variant {
            cfg.insert("variant".into(), json!(v));
        }
        cfg.insert("os".into(), json!(platform.os));
        if let Some(v) = &platform.os_version {
            cfg.insert("os.version".into(), json!(v));
        }
        if !platform.os_features.is_empty() {
            cfg.insert("os.features".into(), json!(platform.os_features));
        }
        cfg.insert("config".into(), config.to_json());
        let diff_ids: Vec<&str> = layers.iter().map(|l| l.diff_id.as_str()).collect();
        cfg.insert("rootfs".into(), json!({"type": "layers", "diff_ids": diff_ids}));
        let history: Vec<Value> = (0..layers.len())
            .map(|i| json!({"created": CREATED, "created_by": format!("berth-testenv layer {i}")}))
            .collect();
        cfg.insert("history".into(), json!(history));
        let config_json = Bytes::from(serde_json::to_vec(&Value::Object(cfg)).expect("config json"));
        let mut img = Image {
            format,
            platform,
            config,
            layers,
            config_digest: sha256_digest(&config_json),
            config_json,
            manifest_json: Bytes::new(),
            manifest_digest: String::new(),
        };
        img.render_manifest();
        img
    }

    fn render_manifest(&mut self) {
        let layers: Vec<Value> = self
            .layers
            .iter()
            .map(|l| {
                json!({
                    "mediaType": l.compression.layer_media_type(self.format),
                    "digest": l.digest,
                    "size": l.size(),
                })
            })
            .collect();
        let m = json!({
            "schemaVersion": 2,
            "mediaType": self.format.manifest_media_type(),
            "config": {
                "mediaType": self.format.config_media_type(),
                "digest": self.config_digest,
                "size": self.config_json.len(),
            },
            "layers": layers,
        });
        self.manifest_json = Bytes::from(serde_json::to_vec(&m).expect("manifest json"));
        self.manifest_digest = sha256_digest(&self.manifest_json);
    }

    /// The same image in the other family of media types (same config and layer blobs,
    /// different manifest digest).
    pub fn to_format(&self, format: Format) -> Image {
        let mut img = self.clone();
        img.format = format;
        img.render_manifest();
        img
    }

    /// Copy with a different platform: a new config (and so a new image ID), the same layers.
    pub fn with_platform(&self, platform: Platform) -> Image {
        Image::build(self.format, platform, self.config.clone(), self.layers.clone())
    }

    pub fn media_type(&self) -> &'static str {
        self.format.manifest_media_type()
    }
    pub fn diff_ids(&self) -> Vec<String> {
        self.layers.iter().map(|l| l.diff_id.clone()).collect()
    }
    pub fn layer_digests(&self) -> Vec<String> {
        self.layers.iter().map(|l| l.digest.clone()).collect()
    }
    /// Sum of the layer blob sizes as pushed.
    pub fn layers_size(&self) -> u64 {
        self.layers.iter().map(Layer::size).sum()
    }
}

/// An OCI image index or Docker manifest list, holding its images.
#[derive(Clone, Debug)]
pub struct Index {
    pub format: Format,
    pub images: Vec<Image>,
    pub json: Bytes,
    pub digest: String,
}

impl Index {
    /// Images of the other format are converted to `format` first.
    pub fn build(format: Format, images: Vec<Image>) -> Index {
        let images: Vec<Image> =
            images.into_iter().map(|i| if i.format == format { i } else { i.to_format(format) }).collect();
        let manifests: Vec<Value> = images
            .iter()
            .map(|i| {
                json!({
                    "mediaType": i.media_type(),
                    "digest": i.manifest_digest,
                    "size": i.manifest_json.len(),
                    "platform": i.platform.to_json(),
                })
            })
            .collect();
        let v = json!({"schemaVersion": 2, "mediaType": format.index_media_type(), "manifests": manifests});
        let json = Bytes::from(serde_json::to_vec(&v).expect("index json"));
        Index { format, digest: sha256_digest(&json), json, images }
    }

    pub fn media_type(&self) -> &'static str {
        self.format.index_media_type()
    }

    /// The entry whose platform equals `p` exactly.
    pub fn image_for(&self, p: &Platform) -> Option<&Image> {
        self.images.iter().find(|i| &i.platform == p)
    }
}

/// A small deterministic PRNG (splitmix64): incompressible filler without a `rand` dependency.
pub fn pseudo_random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Where [`busybox_layer`] takes busybox from: Debian's `busybox-static`.
pub const BUSYBOX_BIN: &str = "/bin/busybox";

const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
";
const GROUP: &str = "root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
mail:x:8:
wheel:x:10:root
www-data:x:33:
staff:x:50:
users:x:100:
nogroup:x:65534:
";

/// The entries of a runnable busybox rootfs: the static busybox at `/bin/busybox`, every applet
/// of `busybox --list-full` hard-linked to it, `/etc/passwd`, `/etc/group`, `/etc/shadow`,
/// `/tmp` 1777, `/root` 0700. Panics with a clear message if busybox is missing or dynamic.
pub fn busybox_entries() -> LayerBuilder {
    busybox_rootfs(AppletLink::Hard)
}

/// [`busybox_entries`] with every applet a symlink to `/bin/busybox` instead of a hard link.
/// Runs under containerd too: containerd applies a hard link's tar mode (0644 here) to the
/// shared inode, which leaves `/bin/busybox` not executable.
pub fn busybox_symlinked_entries() -> LayerBuilder {
    busybox_rootfs(AppletLink::Symbolic)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum AppletLink {
    Hard,
    Symbolic,
}

fn busybox_rootfs(link: AppletLink) -> LayerBuilder {
    let bin = std::fs::read(BUSYBOX_BIN).unwrap_or_else(|e| {
        panic!("berth-testenv needs Debian's static busybox at {BUSYBOX_BIN} (apt-get install busybox-static): {e}")
    });
    // A dynamic busybox would not run inside a scratch rootfs.
    assert!(!has_elf_interpreter(&bin), "{BUSYBOX_BIN} is dynamically linked; install busybox-static");
    let out = std::process::Command::new(BUSYBOX_BIN).arg("--list-full").output().expect("run busybox --list-full");
    assert!(out.status.success(), "busybox --list-full failed");
    let applets: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().trim_start_matches('/').to_owned())
        .filter(|a| !a.is_empty() && a != "bin/busybox" && a != "linuxrc")
        .collect();

    let mut dirs: std::collections::BTreeSet<String> = [
        "bin",
        "sbin",
        "usr",
        "usr/bin",
        "usr/sbin",
        "usr/local",
        "usr/local/bin",
        "dev",
        "etc",
        "home",
        "proc",
        "root",
        "sys",
        "tmp",
        "var",
        "var/run",
        "var/www",
        "var/spool",
        "var/spool/mail",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for a in &applets {
        let mut p = a.as_str();
        while let Some((parent, _)) = p.rsplit_once('/') {
            dirs.insert(parent.to_owned());
            p = parent;
        }
    }
    let mut b = LayerBuilder::new();
    // BTreeSet order puts every parent before its children.
    for d in &dirs {
        let mode = match d.as_str() {
            "tmp" => 0o1777,
            "root" => 0o700,
            _ => 0o755,
        };
        b = b.dir(d, mode);
    }
    b = b.file("bin/busybox", bin, 0o755);
    for a in &applets {
        b = match link {
            AppletLink::Hard => b.hardlink(a, "bin/busybox"),
            AppletLink::Symbolic => b.symlink(a, "/bin/busybox"),
        };
    }
    let shadow: String =
        PASSWD.lines().map(|l| format!("{}:*:19000:0:99999:7:::\n", l.split(':').next().unwrap_or_default())).collect();
    b.file("etc/passwd", PASSWD, 0o644).file("etc/group", GROUP, 0o644).file("etc/shadow", shadow, 0o600)
}

/// Whether a 64-bit little-endian ELF file has a PT_INTERP program header (is dynamically linked).
fn has_elf_interpreter(elf: &[u8]) -> bool {
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u32_at = |o: usize| elf.get(o..o + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let u64_at = |o: usize| elf.get(o..o + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()) as usize);
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1]) {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38)) else {
        return false;
    };
    (0..phnum).any(|i| u32_at(phoff + i * phentsize) == Some(3))
}

/// [`busybox_entries`] as a layer; built once per process and compression.
pub fn busybox_layer(compression: Compression) -> Layer {
    static CACHE: std::sync::Mutex<Vec<Layer>> = std::sync::Mutex::new(Vec::new());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(l) = cache.iter().find(|l| l.compression == compression) {
        return l.clone();
    }
    let l = busybox_entries().build(compression);
    cache.push(l.clone());
    l
}

/// A single-layer busybox image for the host platform, `Cmd ["sh"]`, gzip.
pub fn busybox_image(format: Format) -> Image {
    Image::build(format, Platform::host(), ContainerConfig::cmd(&["sh"]), vec![busybox_layer(Compression::Gzip)])
}

/// [`busybox_image`] with symlinked applets ([`busybox_symlinked_entries`]): one image that runs
/// under berth's runtime and containerd alike.
pub fn busybox_symlinked_image(format: Format) -> Image {
    static CACHE: std::sync::OnceLock<Layer> = std::sync::OnceLock::new();
    let layer = CACHE.get_or_init(|| busybox_symlinked_entries().build(Compression::Gzip)).clone();
    Image::build(format, Platform::host(), ContainerConfig::cmd(&["sh"]), vec![layer])
}

/// The source of the pause binary, compiled by [`pause_binary`].
pub const PAUSE_C: &str = include_str!("../c/pause.c");

/// A static pause binary (sleeps, reaps children, exits 0 on SIGTERM/SIGINT), compiled from
/// `c/pause.c` with `cc -static -Os` once per process. Panics if no C compiler with a static libc
/// is installed (Debian: build-essential).
pub fn pause_binary() -> Bytes {
    static CACHE: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
    CACHE
        .get_or_init(|| {
            let dir = tempfile::tempdir().expect("tempdir");
            let (src, bin) = (dir.path().join("pause.c"), dir.path().join("pause"));
            std::fs::write(&src, PAUSE_C).expect("write pause.c");
            let out = std::process::Command::new("cc")
                .args(["-static", "-Os", "-s", "-Wall", "-o"])
                .arg(&bin)
                .arg(&src)
                .output()
                .unwrap_or_else(|e| panic!("pause_binary needs a C compiler (apt-get install build-essential): {e}"));
            assert!(out.status.success(), "cc -static pause.c failed:\n{}", String::from_utf8_lossy(&out.stderr));
            Bytes::from(std::fs::read(&bin).expect("read pause binary"))
        })
        .clone()
}

/// A layer holding only `/pause` (0755).
pub fn pause_layer(compression: Compression) -> Layer {
    LayerBuilder::new().file("pause", pause_binary(), 0o755).build(compression)
}

/// The sandbox image: [`pause_layer`], `Entrypoint ["/pause"]`, `User 65535:65535`, host platform.
pub fn pause_image(format: Format) -> Image {
    let cfg = ContainerConfig {
        entrypoint: Some(vec!["/pause".into()]),
        user: Some("65535:65535".into()),
        env: vec![DEFAULT_PATH.into()],
        ..Default::default()
    };
    Image::build(format, Platform::host(), cfg, vec![pause_layer(Compression::Gzip)])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(tar: &[u8]) -> Vec<(String, tar::EntryType, Option<String>)> {
        let mut a = tar::Archive::new(tar);
        a.entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let link = e.link_name().unwrap().map(|l| l.to_string_lossy().into_owned());
                (e.path().unwrap().to_string_lossy().into_owned(), e.header().entry_type(), link)
            })
            .collect()
    }

    #[test]
    fn tar_entries_and_whiteouts() {
        let b = LayerBuilder::new()
            .dir("/a", 0o755)
            .file("/a/f", "hi", 0o600)
            .hardlink("/a/g", "/a/f")
            .symlink("/a/s", "f")
            .whiteout("/b/gone")
            .whiteout("top")
            .opaque("/c");
        let n = names(&b.tar());
        let paths: Vec<&str> = n.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(paths, ["a/", "a/f", "a/g", "a/s", "b/.wh.gone", ".wh.top", "c/.wh..wh..opq"]);
        assert_eq!(n[2].1, tar::EntryType::Link);
        assert_eq!(n[2].2.as_deref(), Some("a/f"));
        assert_eq!(n[3].2.as_deref(), Some("f"));
    }

    #[test]
    fn digests_are_stable_and_compressions_differ() {
        let b = LayerBuilder::new().file("x", "data", 0o644);
        let g1 = b.build(Compression::Gzip);
        let g2 = b.build(Compression::Gzip);
        let z = b.build(Compression::Zstd);
        let p = b.build(Compression::None);
        assert_eq!(g1.digest, g2.digest);
        assert_eq!(g1.diff_id, z.diff_id);
        assert_eq!(p.digest, p.diff_id);
        assert_ne!(g1.digest, z.digest);
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&g1.blob[..]).read_to_end_all(&mut out);
        assert_eq!(sha256_digest(&out), g1.diff_id);
    }

    trait ReadAll {
        fn read_to_end_all(self, out: &mut Vec<u8>);
    }
    impl<R: std::io::Read> ReadAll for R {
        fn read_to_end_all(mut self, out: &mut Vec<u8>) {
            self.read_to_end(out).unwrap();
        }
    }

    #[test]
    fn image_and_index_json() {
        let l = LayerBuilder::new().file("x", "1", 0o644).build(Compression::Gzip);
        let img = Image::build(Format::Oci, Platform::parse("linux/arm64/v8"), ContainerConfig::cmd(&["sh"]), vec![l]);
        let cfg: Value = serde_json::from_slice(&img.config_json).unwrap();
        assert_eq!(cfg["variant"], "v8");
        assert_eq!(cfg["config"]["Cmd"], json!(["sh"]));
        assert_eq!(cfg["rootfs"]["diff_ids"][0], json!(img.layers[0].diff_id));
        let docker = img.to_format(Format::Docker);
        assert_eq!(docker.config_digest, img.config_digest);
        assert_ne!(docker.manifest_digest, img.manifest_digest);
        let win = img.with_platform(Platform::new("windows", "amd64").with_os_version("10.0.17763.4851"));
        assert_ne!(win.config_digest, img.config_digest);
        let idx = Index::build(Format::Docker, vec![img, win]);
        let v: Value = serde_json::from_slice(&idx.json).unwrap();
        assert_eq!(v["mediaType"], DOCKER_LIST);
        assert_eq!(v["manifests"][0]["mediaType"], DOCKER_MANIFEST);
        assert_eq!(v["manifests"][1]["platform"]["os.version"], "10.0.17763.4851");
    }

    #[test]
    fn busybox_layer_has_applets_as_hardlinks() {
        let tar = busybox_entries().tar();
        let n = names(&tar);
        let sh = n.iter().find(|x| x.0 == "bin/sh").expect("bin/sh");
        assert_eq!(sh.1, tar::EntryType::Link);
        assert_eq!(sh.2.as_deref(), Some("bin/busybox"));
        assert!(n.iter().any(|x| x.0 == "tmp/"));
        assert!(n.iter().any(|x| x.0 == "etc/passwd"));
        assert!(n.len() > 100);
    }

    #[test]
    fn the_symlinked_busybox_links_every_applet_to_the_binary_by_absolute_path() {
        let tar = busybox_symlinked_entries().tar();
        let n = names(&tar);
        let sh = n.iter().find(|x| x.0 == "bin/sh").expect("bin/sh");
        assert_eq!(sh.1, tar::EntryType::Symlink);
        assert_eq!(sh.2.as_deref(), Some("/bin/busybox"));
        assert!(!n.iter().any(|x| x.1 == tar::EntryType::Link), "no hard links left");
        assert_eq!(n.len(), names(&busybox_entries().tar()).len(), "the same entries otherwise");
    }

    #[test]
    fn prng_is_deterministic() {
        assert_eq!(pseudo_random_bytes(7, 100), pseudo_random_bytes(7, 100));
        assert_ne!(pseudo_random_bytes(7, 100), pseudo_random_bytes(8, 100));
    }
}
