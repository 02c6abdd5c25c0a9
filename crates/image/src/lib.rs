//! OCI images per runtime handler (KEP-4216): registry pulls, a content-addressed store, layer
//! unpacking, guest-platform matching, and image identity as the tuple (image, handler).
//!
//! [`Images`] is the one entry point the CRI runtime and tools use.
// SKELETON: the public API below is the contract; bodies are to be implemented.

use std::collections::BTreeMap;
use std::path::PathBuf;

pub mod platform;

pub use platform::Platform;

/// Errors, by what a caller does about them (the CRI layer maps each to one gRPC code).
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The image (for that handler) is not in the store.
    #[error("image {image:?} not found for runtime handler {handler:?}")]
    NotFound { image: String, handler: String },
    /// Bad reference, unknown handler, missing tag... → InvalidArgument.
    #[error("{0}")]
    InvalidArgument(String),
    /// The registry refused our credentials → Unauthenticated / PermissionDenied.
    #[error("registry {registry} refused access to {repository}: {reason}")]
    Unauthorized { registry: String, repository: String, reason: String },
    /// The index offers no manifest for the handler's guest platform → FailedPrecondition.
    #[error("no manifest in {image} matches platform {wanted}; the index offers: {offered}")]
    NoMatchingPlatform { image: String, wanted: String, offered: String },
    /// Downloaded content does not match its digest or size → DataLoss.
    #[error("content of {digest} does not match: {reason}")]
    DigestMismatch { digest: String, reason: String },
    /// Registry unreachable or failing → Unavailable.
    #[error("registry {registry} unavailable")]
    RegistryUnavailable {
        registry: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Disk full → ResourceExhausted.
    #[error("no space left while storing {what}")]
    NoSpace { what: String },
    #[error("image store error at {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Internal(String),
}

/// Where a registry host is served from and how it is reached.
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct RegistryHost {
    /// Endpoints tried in order before the host itself, e.g. `http://127.0.0.1:5000`.
    #[serde(default)]
    pub mirrors: Vec<String>,
    /// Plain HTTP (and unverified TLS) allowed. Loopback hosts are always allowed plain HTTP.
    #[serde(default)]
    pub insecure: bool,
    /// Extra CA certificates (PEM files) trusted for this host.
    #[serde(default)]
    pub ca_files: Vec<PathBuf>,
}

/// What [`Images::open`] needs.
#[derive(Debug, Clone)]
pub struct ImagesConfig {
    /// Store root; blobs, unpacked layers and image records live under it.
    pub root: PathBuf,
    /// Runtime handler name → its guest platform.
    pub handlers: BTreeMap<String, Platform>,
    /// The handler an empty `runtime_handler` means.
    pub default_handler: String,
    /// Registry host (`docker.io`, `127.0.0.1:5000`) → settings.
    pub registries: BTreeMap<String, RegistryHost>,
}

/// Registry credentials, as CRI's `AuthConfig` carries them.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    pub username: String,
    pub password: String,
    /// `auth` field: base64 of `user:password`.
    pub auth: String,
    pub identity_token: String,
    pub registry_token: String,
}

/// One image as stored for one handler.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ImageRecord {
    /// `sha256:<config digest>`, the CRI image id.
    pub id: String,
    pub handler: String,
    /// `docker.io/library/busybox:latest`, ...
    pub repo_tags: Vec<String>,
    /// `docker.io/library/busybox@sha256:<manifest or index digest as pulled>`.
    pub repo_digests: Vec<String>,
    /// The manifest chosen for the handler's platform.
    pub manifest_digest: String,
    /// Compressed size of config + layers, as crictl shows.
    pub size: u64,
    pub platform: Platform,
    /// The OCI image config JSON (`config.User`, `Env`, `Entrypoint`, ...).
    pub config: serde_json::Value,
    /// Uncompressed layer digests, lowest first.
    pub diff_ids: Vec<String>,
    pub pinned: bool,
}

/// Pull progress, for progress bars.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// The manifest is known: every layer digest with its compressed size.
    Resolved { manifest: String, layers: Vec<(String, u64)> },
    /// Bytes of one layer downloaded so far (cumulative).
    Downloading { digest: String, done: u64, total: u64 },
    /// One layer is downloaded and verified (or was already present).
    Downloaded { digest: String },
    /// One layer is unpacked (or was already).
    Unpacked { digest: String },
    Done { id: String },
}

/// Usage of the store's filesystem, for CRI `ImageFsInfo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsUsage {
    pub used_bytes: u64,
    pub inodes_used: u64,
}

/// The image store and puller. Cheap to share (`Arc`); all methods take `&self`.
pub struct Images {}

impl Images {
    /// Opens (creating if needed) the store and recovers from a crash: partial downloads are
    /// kept for resumption, half-unpacked layers and unreferenced temp files are removed.
    pub fn open(_config: ImagesConfig) -> Result<Self, ImageError> {
        unimplemented!()
    }

    /// Handler names, sorted.
    pub fn handlers(&self) -> Vec<String> {
        unimplemented!()
    }

    /// `""` → the default handler; unknown → `InvalidArgument` naming the configured ones.
    pub fn resolve_handler(&self, _handler: &str) -> Result<String, ImageError> {
        unimplemented!()
    }

    /// Pulls `image` for `handler`: the manifest for the handler's guest platform, its config and
    /// layers (verified, unpacked). Concurrent pulls of the same image share one download.
    pub async fn pull(
        &self,
        _image: &str,
        _handler: &str,
        _credentials: Option<Credentials>,
        _progress: Option<tokio::sync::mpsc::UnboundedSender<Progress>>,
    ) -> Result<ImageRecord, ImageError> {
        unimplemented!()
    }

    /// The image for `handler` by tag, digest reference, or id (full or unique prefix).
    pub fn status(&self, _image: &str, _handler: &str) -> Result<Option<ImageRecord>, ImageError> {
        unimplemented!()
    }

    /// All images, or those of one handler.
    pub fn list(&self, _handler: Option<&str>) -> Result<Vec<ImageRecord>, ImageError> {
        unimplemented!()
    }

    /// Removes the (image, handler) tuple; blobs and layers no tuple uses any more are collected.
    /// Removing a missing image is not an error (CRI RemoveImage is idempotent).
    pub fn remove(&self, _image: &str, _handler: &str) -> Result<(), ImageError> {
        unimplemented!()
    }

    pub fn fs_usage(&self) -> Result<FsUsage, ImageError> {
        unimplemented!()
    }

    /// The store's root (the image filesystem mountpoint for `ImageFsInfo`).
    pub fn root(&self) -> PathBuf {
        unimplemented!()
    }

    /// Unpacked layer directories of an image, lowest first: overlayfs lowerdirs for the runtime.
    /// Whiteouts are in overlayfs form (0/0 character devices, `trusted.overlay.opaque`).
    pub fn layer_dirs(&self, _record: &ImageRecord) -> Result<Vec<PathBuf>, ImageError> {
        unimplemented!()
    }
}
