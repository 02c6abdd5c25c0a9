//! OCI images per runtime handler (KEP-4216): registry pulls, a content-addressed store, layer
//! unpacking, guest-platform matching, and image identity as the tuple (image, handler).
//!
//! [`Images`] is the one entry point the CRI runtime and tools use.
//!
//! On disk, under the root: `blobs/sha256/<hex>` (verified content), `ingest/` (downloads in
//! progress, resumable), `layers/<chain id hex>/` (unpacked layers, overlayfs lowerdirs, shared by
//! every image and handler with the same chain), `records/<handler>/<id hex>.json` (one per
//! (image, handler)). A record is written only after everything it references is complete, and
//! garbage collection keeps exactly what some record (or a pull in flight) references.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Mutex;

use tracing::{debug, info, warn};

mod content;
mod manifest;
pub mod platform;
mod records;
pub mod reference;
mod registry;
mod unpack;

pub use platform::Platform;
pub use reference::Reference;

use content::{ContentStore, KeyedLocks, io_error, sha256_digest};
use manifest::{Descriptor, Document, ImageConfig};
use records::{Records, Stored};
use registry::{Registries, Repository};

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
    Resolved {
        manifest: String,
        layers: Vec<(String, u64)>,
    },
    /// Bytes of one layer downloaded so far (cumulative).
    Downloading {
        digest: String,
        done: u64,
        total: u64,
    },
    /// One layer is downloaded and verified (or was already present).
    Downloaded {
        digest: String,
    },
    /// One layer is unpacked (or was already).
    Unpacked {
        digest: String,
    },
    Done {
        id: String,
    },
}

/// Usage of the store's filesystem, for CRI `ImageFsInfo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsUsage {
    pub used_bytes: u64,
    pub inodes_used: u64,
}

/// Layers downloaded and unpacked at once by one pull.
const PARALLEL_LAYERS: usize = 3;
/// Download progress is reported at most once per this many bytes of a blob.
const PROGRESS_STEP: u64 = 256 << 10;

/// The image store and puller. Cheap to share (`Arc`); all methods take `&self`.
pub struct Images {
    root: PathBuf,
    handlers: BTreeMap<String, Platform>,
    default_handler: String,
    content: ContentStore,
    registries: Registries,
    records: Records,
    layer_locks: KeyedLocks,
    /// Blobs and chain ids that pulls in flight hold against garbage collection.
    leases: Mutex<HashMap<String, usize>>,
}

/// What one pull holds against garbage collection until it is dropped.
struct Lease<'a> {
    leases: &'a Mutex<HashMap<String, usize>>,
    keys: Vec<String>,
}

impl Lease<'_> {
    fn add(&mut self, key: &str) {
        *self.leases.lock().unwrap_or_else(|e| e.into_inner()).entry(key.to_string()).or_default() += 1;
        self.keys.push(key.to_string());
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        for key in &self.keys {
            if let Some(n) = leases.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    leases.remove(key);
                }
            }
        }
    }
}

fn layer_key(chain_id: &str) -> String {
    format!("layer:{chain_id}")
}

impl Images {
    /// Opens (creating if needed) the store and recovers from a crash: partial downloads are
    /// kept for resumption, half-unpacked layers and unreferenced temp files are removed.
    pub fn open(config: ImagesConfig) -> Result<Self, ImageError> {
        let ImagesConfig { root, mut handlers, default_handler, registries } = config;
        if handlers.is_empty() && !default_handler.is_empty() {
            handlers.insert(default_handler.clone(), Platform::host());
        }
        if !handlers.contains_key(&default_handler) {
            return Err(ImageError::InvalidArgument(format!(
                "default runtime handler {default_handler:?} is not configured; configured handlers: {}",
                handlers.keys().cloned().collect::<Vec<_>>().join(", ")
            )));
        }
        for name in handlers.keys() {
            if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
                return Err(ImageError::InvalidArgument(format!("invalid runtime handler name {name:?}")));
            }
        }
        let handlers = handlers.into_iter().map(|(name, platform)| (name, platform.normalized())).collect();
        std::fs::create_dir_all(&root).map_err(|e| io_error(&root, "image store root", e))?;
        let content = ContentStore::open(&root)?;
        let layers = root.join("layers");
        std::fs::create_dir_all(&layers).map_err(|e| io_error(&layers, "layers", e))?;
        for entry in std::fs::read_dir(&layers).map_err(|e| io_error(&layers, "layers", e))?.flatten() {
            if entry.file_name().to_string_lossy().starts_with(unpack::TMP_PREFIX) {
                debug!(path = %entry.path().display(), "removing half-unpacked layer");
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let records = Records::open(&root)?;
        let images = Images {
            root,
            handlers,
            default_handler,
            content,
            registries: Registries::new(registries),
            records,
            layer_locks: KeyedLocks::default(),
            leases: Mutex::default(),
        };
        // A record whose content went missing cannot be run; drop it so a pull restores it.
        for stored in images.records.all() {
            let complete =
                stored.blobs.iter().all(|b| images.content.has(b)) && images.layer_dirs(&stored.record).is_ok();
            if !complete {
                warn!(id = %stored.record.id, handler = %stored.record.handler, "image record lost its content; removing it");
                images.records.remove(&stored.record.handler, &stored.record.id)?;
            }
        }
        info!(root = %images.root.display(), images = images.records.all().len(), "image store open");
        Ok(images)
    }

    /// Handler names, sorted.
    pub fn handlers(&self) -> Vec<String> {
        self.handlers.keys().cloned().collect()
    }

    /// The guest platform of a handler (`""` meaning the default one).
    pub fn platform(&self, handler: &str) -> Result<Platform, ImageError> {
        let handler = self.resolve_handler(handler)?;
        Ok(self.handlers[&handler].clone())
    }

    /// `""` → the default handler; unknown → `InvalidArgument` naming the configured ones.
    pub fn resolve_handler(&self, handler: &str) -> Result<String, ImageError> {
        if handler.is_empty() {
            return Ok(self.default_handler.clone());
        }
        if self.handlers.contains_key(handler) {
            return Ok(handler.to_string());
        }
        Err(ImageError::InvalidArgument(format!(
            "runtime handler {handler:?} is not configured; configured handlers: {}",
            self.handlers().join(", ")
        )))
    }

    /// Pulls `image` for `handler`: the manifest for the handler's guest platform, its config and
    /// layers (verified, unpacked). Concurrent pulls of the same image share one download.
    pub async fn pull(
        &self,
        image: &str,
        handler: &str,
        credentials: Option<Credentials>,
        progress: Option<tokio::sync::mpsc::UnboundedSender<Progress>>,
    ) -> Result<ImageRecord, ImageError> {
        let handler = self.resolve_handler(handler)?;
        let reference = Reference::parse(image)?;
        let started = std::time::Instant::now();
        let send = move |p: Progress| {
            if let Some(tx) = &progress {
                let _ = tx.send(p);
            }
        };
        let result = self.pull_inner(&reference, &handler, credentials, &send).await;
        match &result {
            Ok(record) => info!(
                image = %reference, handler, id = %record.id, manifest = %record.manifest_digest,
                platform = %record.platform, elapsed_ms = started.elapsed().as_millis() as u64, "image pulled"
            ),
            Err(error) => warn!(image = %reference, handler, %error, "image pull failed"),
        }
        // A full disk: give back what this failed pull stored and nothing references.
        if let Err(ImageError::NoSpace { .. }) = &result
            && let Err(error) = self.gc().and_then(|()| self.drop_ingests())
        {
            warn!(%error, "garbage collection after a full disk failed");
        }
        result
    }

    async fn pull_inner(
        &self,
        reference: &Reference,
        handler: &str,
        credentials: Option<Credentials>,
        send: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<ImageRecord, ImageError> {
        let platform = self.handlers[handler].clone();
        let mut lease = Lease { leases: &self.leases, keys: Vec::new() };
        let repo = self.registries.repository(&reference.registry, &reference.repository, credentials)?;

        // The document the reference names: a manifest, or an index to choose from.
        let top = repo.manifest(reference.manifest_reference()).await?;
        let top_digest = sha256_digest(&top.bytes);
        if let Some(wanted) = &reference.digest
            && *wanted != top_digest
        {
            return Err(ImageError::DigestMismatch {
                digest: wanted.clone(),
                reason: format!("registry sent a manifest hashing to {top_digest}"),
            });
        }
        lease.add(&top_digest);
        self.content.put(&top_digest, None, &top.bytes).await?;
        let mut blobs = vec![top_digest.clone()];
        let (manifest_digest, manifest, chosen) = match Document::parse(&top.content_type, &top.bytes)? {
            Document::Manifest(manifest) => (top_digest.clone(), manifest, None),
            Document::Index(index) => {
                let candidates: Vec<(&Descriptor, Platform)> = index
                    .manifests
                    .iter()
                    .filter(|d| !manifest::is_attestation(d))
                    .filter_map(|d| d.platform.as_ref().map(|p| (d, p.to_platform())))
                    .collect();
                let Some(i) = platform.select(candidates.iter().map(|(_, p)| p)) else {
                    return Err(ImageError::NoMatchingPlatform {
                        image: reference.to_string(),
                        wanted: platform.to_string(),
                        offered: candidates.iter().map(|(_, p)| p.to_string()).collect::<Vec<_>>().join(", "),
                    });
                };
                let (descriptor, chosen) = (candidates[i].0, candidates[i].1.clone());
                check_digest(&descriptor.digest)?;
                debug!(image = %reference, handler, manifest = %descriptor.digest, platform = %chosen, "chose manifest from index");
                let child = repo.manifest(&descriptor.digest).await?;
                lease.add(&descriptor.digest);
                self.content.put(&descriptor.digest, Some(descriptor.size), &child.bytes).await?;
                let content_type =
                    if child.content_type.is_empty() { &descriptor.media_type } else { &child.content_type };
                match Document::parse(content_type, &child.bytes)? {
                    Document::Manifest(manifest) => (descriptor.digest.clone(), manifest, Some(chosen)),
                    Document::Index(_) => {
                        return Err(ImageError::InvalidArgument(format!(
                            "index {top_digest} points at another index {}; nested indexes are not supported",
                            descriptor.digest
                        )));
                    }
                }
            }
        };
        if manifest_digest != top_digest {
            blobs.push(manifest_digest.clone());
        }

        // The config: what the layers must unpack to, and what the runtime needs.
        let config_desc = &manifest.config;
        check_digest(&config_desc.digest)?;
        lease.add(&config_desc.digest);
        let config_bytes = self.config_blob(&repo, config_desc).await?;
        blobs.push(config_desc.digest.clone());
        let config_json: serde_json::Value = serde_json::from_slice(&config_bytes).map_err(|e| {
            ImageError::InvalidArgument(format!("image config {} is not JSON: {e}", config_desc.digest))
        })?;
        let config: ImageConfig = serde_json::from_value(config_json.clone())
            .map_err(|e| ImageError::InvalidArgument(format!("unreadable image config {}: {e}", config_desc.digest)))?;
        let platform_of_image = match chosen {
            Some(chosen) => chosen,
            None if config.os.is_empty() || config.architecture.is_empty() => platform.clone(),
            None => {
                let own = Platform {
                    os: config.os.clone(),
                    architecture: config.architecture.clone(),
                    variant: config.variant.clone(),
                    os_version: config.os_version.clone(),
                    os_features: Vec::new(),
                }
                .normalized();
                if !platform.matches(&own) {
                    return Err(ImageError::NoMatchingPlatform {
                        image: reference.to_string(),
                        wanted: platform.to_string(),
                        offered: own.to_string(),
                    });
                }
                own
            }
        };
        let diff_ids = config.rootfs.diff_ids.clone();
        if diff_ids.len() != manifest.layers.len() {
            return Err(ImageError::InvalidArgument(format!(
                "image config {} lists {} diff_ids for {} layers",
                config_desc.digest,
                diff_ids.len(),
                manifest.layers.len()
            )));
        }
        for digest in manifest.layers.iter().map(|l| &l.digest).chain(&diff_ids) {
            check_digest(digest)?;
        }
        let chains = unpack::chain_ids(&diff_ids);
        for (layer, chain) in manifest.layers.iter().zip(&chains) {
            lease.add(&layer.digest);
            lease.add(&layer_key(chain));
            blobs.push(layer.digest.clone());
        }
        send(Progress::Resolved {
            manifest: manifest_digest.clone(),
            layers: manifest.layers.iter().map(|l| (l.digest.clone(), l.size)).collect(),
        });

        // Layers: downloaded and unpacked a few at a time. (The futures are built first: a
        // closure inside the stream would make the pull future not `Send`.)
        let mut fetches = Vec::with_capacity(manifest.layers.len());
        for (layer, (chain, diff_id)) in manifest.layers.iter().zip(chains.iter().zip(&diff_ids)) {
            fetches.push(self.fetch_layer(&repo, layer, chain, diff_id, send));
        }
        run_layer_fetches(fetches).await?;

        let size = config_desc.size + manifest.layers.iter().map(|l| l.size).sum::<u64>();
        let record = ImageRecord {
            id: config_desc.digest.clone(),
            handler: handler.to_string(),
            repo_tags: reference.tagged().into_iter().collect(),
            repo_digests: vec![reference.with_digest(&top_digest)],
            manifest_digest,
            size,
            platform: platform_of_image,
            config: config_json,
            diff_ids,
            pinned: false,
        };
        blobs.dedup();
        let record = self.records.commit_pull(Stored { record, blobs })?;
        send(Progress::Done { id: record.id.clone() });
        drop(lease);
        Ok(record)
    }

    /// The config blob, from the store if it is there and intact, else from the registry.
    async fn config_blob(&self, repo: &Repository<'_>, desc: &Descriptor) -> Result<Vec<u8>, ImageError> {
        if self.content.has(&desc.digest) {
            match self.content.read(&desc.digest) {
                Ok(bytes) => return Ok(bytes),
                Err(ImageError::DigestMismatch { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let bytes = repo.small_blob(&desc.digest, desc.size).await?;
        self.content.put(&desc.digest, Some(desc.size), &bytes).await?;
        Ok(bytes)
    }

    /// Makes sure one layer's blob is stored and unpacked as `chain_id`.
    async fn fetch_layer(
        &self,
        repo: &Repository<'_>,
        layer: &Descriptor,
        chain_id: &str,
        diff_id: &str,
        send: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<(), ImageError> {
        self.fetch_blob(repo, layer, send).await?;
        let _guard = self.layer_locks.lock(chain_id).await;
        let layers = self.root.join("layers");
        if !unpack::layer_dir(&layers, chain_id).is_dir() {
            let blob = self.content.blob_path(&layer.digest);
            let (chain, diff, media_type) = (chain_id.to_string(), diff_id.to_string(), layer.media_type.clone());
            let started = std::time::Instant::now();
            let unpacked =
                tokio::task::spawn_blocking(move || unpack::unpack_layer(&blob, &media_type, &layers, &chain, &diff))
                    .await
                    .map_err(|e| ImageError::Internal(format!("unpack task failed: {e}")))??;
            debug!(
                layer = %layer.digest, chain_id, bytes = unpacked.uncompressed,
                elapsed_ms = started.elapsed().as_millis() as u64, "layer unpacked"
            );
        }
        send(Progress::Unpacked { digest: layer.digest.clone() });
        Ok(())
    }

    /// Makes sure blob `desc` is stored, downloading (or resuming) it once however many pulls
    /// want it at the same time.
    async fn fetch_blob(
        &self,
        repo: &Repository<'_>,
        desc: &Descriptor,
        send: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<(), ImageError> {
        let _guard = self.content.lock(&desc.digest).await;
        if !self.content.has(&desc.digest) {
            let mut ingest = self.content.ingest(&desc.digest, desc.size).await?;
            // Reported every PROGRESS_STEP bytes and at the end, not per network chunk.
            let reported = std::sync::atomic::AtomicU64::new(0);
            let progress = |done: u64| {
                let last = reported.load(std::sync::atomic::Ordering::Relaxed);
                if done >= last + PROGRESS_STEP || done == desc.size || done < last {
                    reported.store(done, std::sync::atomic::Ordering::Relaxed);
                    send(Progress::Downloading { digest: desc.digest.clone(), done, total: desc.size });
                }
            };
            match repo.blob(&desc.digest, desc.size, &mut ingest, &progress).await {
                Ok(()) => ingest.commit().await?,
                Err(e @ (ImageError::NoSpace { .. } | ImageError::DigestMismatch { .. })) => {
                    ingest.discard();
                    return Err(e);
                }
                // Anything else keeps the ingest, for the next attempt to resume.
                Err(e) => return Err(e),
            }
        }
        send(Progress::Downloaded { digest: desc.digest.clone() });
        Ok(())
    }

    /// The image for `handler` by tag, digest reference, or id (full or unique prefix).
    pub fn status(&self, image: &str, handler: &str) -> Result<Option<ImageRecord>, ImageError> {
        let handler = self.resolve_handler(handler)?;
        Ok(self.records.find(&handler, image))
    }

    /// All images, or those of one handler.
    pub fn list(&self, handler: Option<&str>) -> Result<Vec<ImageRecord>, ImageError> {
        let handler = handler.map(|h| self.resolve_handler(h)).transpose()?;
        Ok(self
            .records
            .all()
            .into_iter()
            .map(|s| s.record)
            .filter(|r| handler.as_ref().is_none_or(|h| r.handler == *h))
            .collect())
    }

    /// Removes the (image, handler) tuple; blobs and layers no tuple uses any more are collected.
    /// Removing a missing image is not an error (CRI RemoveImage is idempotent).
    pub fn remove(&self, image: &str, handler: &str) -> Result<(), ImageError> {
        let handler = self.resolve_handler(handler)?;
        let Some(record) = self.records.find(&handler, image) else {
            debug!(image, handler, "image to remove is not there");
            return Ok(());
        };
        self.records.remove(&handler, &record.id)?;
        info!(image, handler, id = %record.id, "image removed");
        self.gc()
    }

    /// Deletes every blob and unpacked layer that no record references and no pull in flight
    /// holds (mark and sweep). [`Self::remove`] runs it; it is safe to run at any time.
    pub fn gc(&self) -> Result<(), ImageError> {
        // Holding the lease table keeps pulls from starting to rely on content mid-sweep.
        let leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        let records = self.records.all();
        let mut blobs: HashSet<String> = records.iter().flat_map(|s| s.blobs.iter().cloned()).collect();
        let mut layers: HashSet<String> = records
            .iter()
            .flat_map(|s| unpack::chain_ids(&s.record.diff_ids))
            .map(|chain| content::digest_hex(&chain).to_string())
            .collect();
        for key in leases.keys() {
            match key.strip_prefix("layer:") {
                Some(chain) => layers.insert(content::digest_hex(chain).to_string()),
                None => blobs.insert(key.clone()),
            };
        }
        // Layers under a mounted rootfs stay until it is unmounted (as containerd keeps the
        // snapshots of a running container whose image was removed); a later sweep frees them.
        let layers_dir = self.root.join("layers");
        if let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") {
            for dir in overlay_lower_dirs(&mountinfo) {
                if let Ok(name) = dir.strip_prefix(&layers_dir)
                    && let Some(name) = name.iter().next()
                {
                    layers.insert(name.to_string_lossy().into_owned());
                }
            }
        }
        let mut freed_blobs = 0;
        for digest in self.content.list()? {
            if !blobs.contains(&digest) {
                self.content.delete(&digest)?;
                freed_blobs += 1;
            }
        }
        let mut freed_layers = 0;
        for entry in std::fs::read_dir(&layers_dir).map_err(|e| io_error(&layers_dir, "layers", e))?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(unpack::TMP_PREFIX) || layers.contains(&name) {
                continue;
            }
            std::fs::remove_dir_all(entry.path()).map_err(|e| io_error(&entry.path(), "layer", e))?;
            freed_layers += 1;
        }
        if freed_blobs + freed_layers > 0 {
            content::sync_dir(&layers_dir)?;
            info!(blobs = freed_blobs, layers = freed_layers, "garbage collected image content");
        }
        Ok(())
    }

    /// Removes partial downloads no pull in flight holds (they are otherwise kept to resume).
    fn drop_ingests(&self) -> Result<(), ImageError> {
        let leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        self.content.remove_ingests(|digest| leases.contains_key(digest))
    }

    /// Bytes and inodes used under the store root (each inode counted once).
    pub fn fs_usage(&self) -> Result<FsUsage, ImageError> {
        use std::os::unix::fs::MetadataExt as _;
        let mut seen = HashSet::new();
        let mut usage = FsUsage { used_bytes: 0, inodes_used: 0 };
        let mut stack = vec![self.root.clone()];
        while let Some(path) = stack.pop() {
            let meta = match std::fs::symlink_metadata(&path) {
                Ok(meta) => meta,
                // Removed while we walked.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_error(&path, "image store usage", e)),
            };
            if !seen.insert((meta.dev(), meta.ino())) {
                continue;
            }
            usage.inodes_used += 1;
            usage.used_bytes += meta.blocks() * 512;
            if meta.is_dir() {
                let entries = match std::fs::read_dir(&path) {
                    Ok(entries) => entries,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io_error(&path, "image store usage", e)),
                };
                stack.extend(entries.flatten().map(|e| e.path()));
            }
        }
        Ok(usage)
    }

    /// The store's root (the image filesystem mountpoint for `ImageFsInfo`).
    pub fn root(&self) -> PathBuf {
        self.root.clone()
    }

    /// Unpacked layer directories of an image, lowest first: overlayfs lowerdirs for the runtime.
    /// Whiteouts are in overlayfs form (0/0 character devices, `trusted.overlay.opaque`).
    pub fn layer_dirs(&self, record: &ImageRecord) -> Result<Vec<PathBuf>, ImageError> {
        let layers = self.root.join("layers");
        unpack::chain_ids(&record.diff_ids)
            .iter()
            .map(|chain| {
                let dir = unpack::layer_dir(&layers, chain);
                if dir.is_dir() {
                    Ok(dir)
                } else {
                    Err(ImageError::NotFound {
                        image: format!("{} (layer {chain})", record.id),
                        handler: record.handler.clone(),
                    })
                }
            })
            .collect()
    }
}

fn check_digest(digest: &str) -> Result<(), ImageError> {
    reference::validate_digest(digest)
        .map_err(|why| ImageError::InvalidArgument(format!("bad digest in manifest: {why}")))
}

/// Runs layer fetches `PARALLEL_LAYERS` at a time. After the first failure no new fetch starts,
/// but the running ones are awaited: an unpack runs on a blocking thread that dropping its future
/// would not stop, and it must not rename a layer into place after the failed pull cleaned up.
async fn run_layer_fetches<F>(fetches: Vec<F>) -> Result<(), ImageError>
where
    F: std::future::Future<Output = Result<(), ImageError>>,
{
    use futures::StreamExt as _;
    let mut pending = fetches.into_iter();
    let mut running = futures::stream::FuturesUnordered::new();
    let mut first_error = None;
    loop {
        while first_error.is_none() && running.len() < PARALLEL_LAYERS {
            match pending.next() {
                Some(fetch) => running.push(fetch),
                None => break,
            }
        }
        match running.next().await {
            Some(Err(error)) => {
                first_error.get_or_insert(error);
            }
            Some(Ok(())) => {}
            None => break,
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The `lowerdir`s of every overlay mount in a `/proc/self/mountinfo` text.
fn overlay_lower_dirs(mountinfo: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for line in mountinfo.lines() {
        // "... - overlay overlay rw,lowerdir=A:B,upperdir=U,workdir=W"
        let Some((_, after)) = line.split_once(" - ") else { continue };
        let mut fields = after.split(' ');
        if fields.next() != Some("overlay") {
            continue;
        }
        let Some(options) = fields.nth(1) else { continue };
        for option in options.split(',') {
            if let Some(lower) = option.strip_prefix("lowerdir=") {
                // mountinfo escapes space, tab, newline and backslash as octal.
                let lower =
                    lower.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\");
                dirs.extend(lower.split(':').filter(|d| !d.is_empty()).map(PathBuf::from));
            }
        }
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lower_dirs_of_overlay_mounts_are_read_from_mountinfo() {
        let mountinfo = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
300 22 0:77 / /r/c1/rootfs rw,relatime - overlay overlay rw,lowerdir=/s/layers/b:/s/layers/a,upperdir=/r/c1/upper,workdir=/r/c1/work,volatile
301 22 0:78 / /r/c2/rootfs rw,relatime - overlay overlay rw,lowerdir=/s/my\\040layers/c,upperdir=/u,workdir=/w
302 22 0:79 / /tmp rw - tmpfs tmpfs rw,lowerdir=/not/overlay
";
        let dirs = overlay_lower_dirs(mountinfo);
        let want: Vec<PathBuf> = ["/s/layers/b", "/s/layers/a", "/s/my layers/c"].iter().map(PathBuf::from).collect();
        assert_eq!(dirs, want);
    }

    fn assert_send<T: Send>(_: &T) {}

    fn images(root: &std::path::Path) -> Images {
        let handlers = [("runc", "linux/amd64"), ("gvisor", "linux/arm64")]
            .into_iter()
            .map(|(n, p)| (n.to_string(), Platform::parse(p).unwrap()))
            .collect();
        Images::open(ImagesConfig {
            root: root.to_path_buf(),
            handlers,
            default_handler: "runc".into(),
            registries: BTreeMap::new(),
        })
        .unwrap()
    }

    /// Stores a fake image for `handler` whose one layer is `layer` (blob bytes) and returns it.
    async fn fake_image(images: &Images, handler: &str, config: &[u8], layer: &[u8]) -> ImageRecord {
        let (config_digest, layer_digest) = (sha256_digest(config), sha256_digest(layer));
        images.content.put(&config_digest, None, config).await.unwrap();
        images.content.put(&layer_digest, None, layer).await.unwrap();
        let diff_id = layer_digest.clone();
        std::fs::create_dir_all(unpack::layer_dir(&images.root.join("layers"), &diff_id)).unwrap();
        let record = ImageRecord {
            id: config_digest.clone(),
            handler: handler.into(),
            repo_tags: vec![format!("docker.io/library/{handler}:latest")],
            repo_digests: vec![],
            manifest_digest: config_digest.clone(),
            size: 1,
            platform: Platform::host(),
            config: serde_json::json!({}),
            diff_ids: vec![diff_id],
            pinned: false,
        };
        images.records.commit_pull(Stored { record, blobs: vec![config_digest, layer_digest] }).unwrap()
    }

    #[tokio::test]
    async fn gc_keeps_what_records_and_leases_reference_and_sweeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let images = images(dir.path());
        let shared_layer = b"shared layer".to_vec();
        let a = fake_image(&images, "runc", b"config a", &shared_layer).await;
        let b = fake_image(&images, "gvisor", b"config b", &shared_layer).await;
        let orphan = sha256_digest(b"orphan");
        images.content.put(&orphan, None, b"orphan").await.unwrap();
        let leased = sha256_digest(b"in flight");
        images.content.put(&leased, None, b"in flight").await.unwrap();
        std::fs::create_dir(dir.path().join("layers").join("f".repeat(64))).unwrap();
        let mut lease = Lease { leases: &images.leases, keys: Vec::new() };
        lease.add(&leased);

        images.gc().unwrap();
        assert!(!images.content.has(&orphan));
        assert!(images.content.has(&leased));
        assert!(!dir.path().join("layers").join("f".repeat(64)).exists());
        assert_eq!(images.content.list().unwrap().len(), 4);

        // Removing one handler's image keeps the shared layer for the other.
        images.remove(&a.id, "runc").unwrap();
        assert!(!images.content.has(&a.id));
        assert_eq!(images.layer_dirs(&b).unwrap().len(), 1);
        assert!(images.content.has(&b.diff_ids[0]));
        drop(lease);
        images.remove("gvisor", "gvisor").unwrap();
        assert!(images.content.list().unwrap().is_empty());
        assert_eq!(std::fs::read_dir(dir.path().join("layers")).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn reopening_drops_records_whose_content_vanished_and_half_unpacked_layers() {
        let dir = tempfile::tempdir().unwrap();
        let images = images(dir.path());
        let a = fake_image(&images, "runc", b"config a", b"layer a").await;
        let b = fake_image(&images, "runc", b"config b", b"layer b").await;
        std::fs::remove_file(images.content.blob_path(&a.id)).unwrap();
        std::fs::create_dir(dir.path().join("layers").join(".tmp-abc-1")).unwrap();
        drop(images);
        let images = super::tests::images(dir.path());
        assert_eq!(images.list(None).unwrap(), vec![b]);
        assert!(!dir.path().join("layers").join(".tmp-abc-1").exists());
    }

    #[test]
    fn handlers_resolve_with_the_default_for_empty() {
        let dir = tempfile::tempdir().unwrap();
        let images = images(dir.path());
        assert_eq!(images.handlers(), vec!["gvisor", "runc"]);
        assert_eq!(images.resolve_handler("").unwrap(), "runc");
        assert_eq!(images.resolve_handler("gvisor").unwrap(), "gvisor");
        match images.resolve_handler("foo") {
            Err(ImageError::InvalidArgument(m)) => {
                assert_eq!(m, "runtime handler \"foo\" is not configured; configured handlers: gvisor, runc")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(images.platform("gvisor").unwrap().to_string(), "linux/arm64/v8");
    }

    #[test]
    fn pull_future_is_send_so_servers_can_spawn_it() {
        let dir = tempfile::tempdir().unwrap();
        let images = Images::open(ImagesConfig {
            root: dir.path().to_path_buf(),
            handlers: BTreeMap::new(),
            default_handler: "runc".into(),
            registries: BTreeMap::new(),
        })
        .unwrap();
        assert_send(&images.pull("busybox", "", None, None));
        assert_eq!(images.handlers(), vec!["runc"]);
    }
}
