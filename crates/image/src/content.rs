//! The content-addressed blob store: `blobs/sha256/<hex>`, each written through an ingest file
//! (`ingest/<hex>`) whose sha256 and size are checked before it is renamed into place.
//!
//! Rules that keep a crash or a bad registry from leaving anything half-visible:
//! - a blob exists under `blobs/` only after its bytes were hashed, matched its digest and size,
//!   were fsynced, renamed atomically, and the directory fsynced;
//! - an ingest file is only ever the first N bytes of its blob, written at explicit offsets, so a
//!   later pull resumes it by re-hashing those bytes and asking the registry for the rest (even a
//!   late write from a cancelled download lands the same bytes at the same place);
//! - a mismatch or a full disk removes the ingest.
//!
//! One async lock per digest makes concurrent pulls of the same blob share one download: the
//! second waits, then finds the blob present.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use sha2::{Digest as _, Sha256};
use tracing::{debug, warn};

use crate::ImageError;

/// Writes are gathered into chunks of this size before going to disk.
const WRITE_CHUNK: usize = 1 << 20;
/// Ingest files untouched for this long are assumed abandoned and removed on open.
const STALE_INGEST: Duration = Duration::from_secs(24 * 3600);

pub(crate) struct ContentStore {
    root: PathBuf,
    locks: KeyedLocks,
}

/// One async mutex per key (a digest, a chain id), created on demand and dropped when unused.
#[derive(Default)]
pub(crate) struct KeyedLocks {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl KeyedLocks {
    pub(crate) async fn lock(&self, key: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
            locks.retain(|_, l| Arc::strong_count(l) > 1);
            locks.entry(key.to_string()).or_default().clone()
        };
        lock.lock_owned().await
    }
}

/// Maps an IO error to the store's error: a full disk is `NoSpace`, anything else `Io`.
pub(crate) fn io_error(path: &Path, what: &str, source: std::io::Error) -> ImageError {
    if source.raw_os_error() == Some(nix::libc::ENOSPC) || source.kind() == std::io::ErrorKind::StorageFull {
        ImageError::NoSpace { what: what.to_string() }
    } else {
        ImageError::Io { path: path.to_path_buf(), source }
    }
}

/// `sha256:<hex>` of `bytes`.
pub(crate) fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The hex part of a digest already validated as `sha256:<64 hex>`.
pub(crate) fn digest_hex(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

/// fsyncs a directory so a rename inside it survives a crash.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), ImageError> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_error(dir, &dir.display().to_string(), e))
}

/// A unique suffix for temporary names.
pub(crate) fn unique_suffix() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{}-{n}-{nanos}", std::process::id())
}

impl ContentStore {
    /// Creates the directories and tidies up after a crash: ingests of blobs already present,
    /// stale ingests and temporary files are removed; other ingests are kept for resumption.
    pub(crate) fn open(root: &Path) -> Result<Self, ImageError> {
        let store = ContentStore { root: root.to_path_buf(), locks: KeyedLocks::default() };
        for dir in [store.blobs_dir(), store.ingest_dir()] {
            std::fs::create_dir_all(&dir).map_err(|e| io_error(&dir, "store directories", e))?;
        }
        let ingest_dir = store.ingest_dir();
        let entries = std::fs::read_dir(&ingest_dir).map_err(|e| io_error(&ingest_dir, "ingest", e))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let stale = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_INGEST);
            let done = store.blobs_dir().join(&name).exists();
            if name.ends_with(".tmp") || stale || done || name.len() != 64 {
                debug!(path = %path.display(), stale, done, "removing leftover ingest");
                let _ = std::fs::remove_file(&path);
            }
        }
        Ok(store)
    }

    fn blobs_dir(&self) -> PathBuf {
        self.root.join("blobs").join("sha256")
    }

    fn ingest_dir(&self) -> PathBuf {
        self.root.join("ingest")
    }

    pub(crate) fn blob_path(&self, digest: &str) -> PathBuf {
        self.blobs_dir().join(digest_hex(digest))
    }

    pub(crate) fn has(&self, digest: &str) -> bool {
        self.blob_path(digest).is_file()
    }

    /// Digests of every stored blob.
    pub(crate) fn list(&self) -> Result<Vec<String>, ImageError> {
        let dir = self.blobs_dir();
        let entries = std::fs::read_dir(&dir).map_err(|e| io_error(&dir, "blobs", e))?;
        Ok(entries.flatten().map(|e| format!("sha256:{}", e.file_name().to_string_lossy())).collect())
    }

    pub(crate) fn delete(&self, digest: &str) -> Result<(), ImageError> {
        let path = self.blob_path(digest);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(&path, digest, e)),
        }
    }

    /// Removes ingest files, except those of digests `keep` names.
    pub(crate) fn remove_ingests(&self, keep: impl Fn(&str) -> bool) -> Result<(), ImageError> {
        let dir = self.ingest_dir();
        for entry in std::fs::read_dir(&dir).map_err(|e| io_error(&dir, "ingest", e))?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let hex = name.split('.').next().unwrap_or_default();
            if !keep(&format!("sha256:{hex}")) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(())
    }

    /// The per-digest lock: hold it while checking for and fetching a blob.
    pub(crate) async fn lock(&self, digest: &str) -> tokio::sync::OwnedMutexGuard<()> {
        self.locks.lock(digest).await
    }

    /// Reads a small blob (manifest, config), re-verifying it; a blob that no longer matches its
    /// digest is removed and reported, never returned.
    pub(crate) fn read(&self, digest: &str) -> Result<Vec<u8>, ImageError> {
        let path = self.blob_path(digest);
        let bytes = std::fs::read(&path).map_err(|e| io_error(&path, digest, e))?;
        let actual = sha256_digest(&bytes);
        if actual != digest {
            warn!(digest, actual, "stored blob is corrupt; removing it");
            let _ = std::fs::remove_file(&path);
            return Err(ImageError::DigestMismatch {
                digest: digest.to_string(),
                reason: format!("stored copy hashes to {actual}"),
            });
        }
        Ok(bytes)
    }

    /// Stores `bytes` (already in memory) as `digest`, verifying both digest and size.
    pub(crate) async fn put(&self, digest: &str, size: Option<u64>, bytes: &[u8]) -> Result<(), ImageError> {
        verify(digest, size, bytes.len() as u64, &sha256_digest(bytes))?;
        let _guard = self.lock(digest).await;
        if self.has(digest) {
            return Ok(());
        }
        let tmp = self.ingest_dir().join(format!("{}.{}.tmp", digest_hex(digest), unique_suffix()));
        let target = self.blob_path(digest);
        let (tmp2, target2, bytes, digest2) = (tmp.clone(), target.clone(), bytes.to_vec(), digest.to_string());
        let result = tokio::task::spawn_blocking(move || -> Result<(), ImageError> {
            let write = || -> std::io::Result<()> {
                let file = std::fs::File::create(&tmp2)?;
                file.write_all_at(&bytes, 0)?;
                file.sync_all()?;
                std::fs::rename(&tmp2, &target2)
            };
            write().map_err(|e| io_error(&tmp2, &digest2, e))
        })
        .await
        .map_err(|e| ImageError::Internal(format!("blob writer task failed: {e}")))?;
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        sync_dir(&self.blobs_dir())
    }

    /// Opens (or resumes) the ingest of `digest`; the caller must hold [`Self::lock`].
    pub(crate) async fn ingest(&self, digest: &str, size: u64) -> Result<Ingest, ImageError> {
        let path = self.ingest_dir().join(digest_hex(digest));
        let (path2, digest2) = (path.clone(), digest.to_string());
        tokio::task::spawn_blocking(move || Ingest::open(path2, digest2, size))
            .await
            .map_err(|e| ImageError::Internal(format!("ingest task failed: {e}")))?
            .map(|mut ingest| {
                ingest.target = self.blob_path(digest);
                ingest
            })
    }
}

fn verify(digest: &str, size: Option<u64>, actual_size: u64, actual: &str) -> Result<(), ImageError> {
    if let Some(size) = size
        && size != actual_size
    {
        return Err(ImageError::DigestMismatch {
            digest: digest.to_string(),
            reason: format!("got {actual_size} bytes, expected {size}"),
        });
    }
    if actual != digest {
        return Err(ImageError::DigestMismatch {
            digest: digest.to_string(),
            reason: format!("content hashes to {actual}"),
        });
    }
    Ok(())
}

/// A blob being written: bytes are hashed as they arrive and land at explicit offsets.
pub(crate) struct Ingest {
    path: PathBuf,
    target: PathBuf,
    digest: String,
    size: u64,
    file: Arc<std::fs::File>,
    hasher: Sha256,
    /// Bytes hashed (and written or buffered) so far.
    offset: u64,
    buffer: Vec<u8>,
}

impl Ingest {
    fn open(path: PathBuf, digest: String, size: u64) -> Result<Self, ImageError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io_error(&path, &digest, e))?;
        let mut ingest = Ingest {
            path: path.clone(),
            target: PathBuf::new(),
            digest,
            size,
            file: Arc::new(file),
            hasher: Sha256::new(),
            offset: 0,
            buffer: Vec::with_capacity(WRITE_CHUNK),
        };
        let existing = ingest.file.metadata().map_err(|e| io_error(&path, &ingest.digest, e))?.len();
        if existing > size {
            ingest.file.set_len(0).map_err(|e| io_error(&path, &ingest.digest, e))?;
        } else if existing > 0 {
            // Re-hash what an earlier attempt left, to continue from there.
            let mut reader = std::io::BufReader::with_capacity(WRITE_CHUNK, (&*ingest.file).take(existing));
            let mut chunk = vec![0u8; WRITE_CHUNK];
            loop {
                let n = reader.read(&mut chunk).map_err(|e| io_error(&path, &ingest.digest, e))?;
                if n == 0 {
                    break;
                }
                ingest.hasher.update(&chunk[..n]);
                ingest.offset += n as u64;
            }
            debug!(digest = %ingest.digest, offset = ingest.offset, "resuming ingest");
        }
        Ok(ingest)
    }

    /// Bytes already present; a download continues from here.
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// Starts over (the registry ignored our Range request).
    pub(crate) async fn reset(&mut self) -> Result<(), ImageError> {
        self.buffer.clear();
        self.hasher = Sha256::new();
        self.offset = 0;
        self.file.set_len(0).map_err(|e| io_error(&self.path, &self.digest, e))
    }

    /// Appends `chunk`; more bytes than the descriptor's size is a mismatch.
    pub(crate) async fn write(&mut self, chunk: &[u8]) -> Result<(), ImageError> {
        if self.offset + chunk.len() as u64 > self.size {
            return Err(ImageError::DigestMismatch {
                digest: self.digest.clone(),
                reason: format!("registry sent more than the expected {} bytes", self.size),
            });
        }
        self.hasher.update(chunk);
        self.offset += chunk.len() as u64;
        self.buffer.extend_from_slice(chunk);
        if self.buffer.len() >= WRITE_CHUNK {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), ImageError> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let data = std::mem::replace(&mut self.buffer, Vec::with_capacity(WRITE_CHUNK));
        let at = self.offset - data.len() as u64;
        let (file, path, digest) = (self.file.clone(), self.path.clone(), self.digest.clone());
        tokio::task::spawn_blocking(move || file.write_all_at(&data, at).map_err(|e| io_error(&path, &digest, e)))
            .await
            .map_err(|e| ImageError::Internal(format!("ingest writer task failed: {e}")))?
    }

    /// Checks size and digest, then makes the blob visible; on any failure the ingest is removed.
    pub(crate) async fn commit(mut self) -> Result<(), ImageError> {
        let result = self.try_commit().await;
        if result.is_err() {
            let _ = std::fs::remove_file(&self.path);
        }
        result
    }

    async fn try_commit(&mut self) -> Result<(), ImageError> {
        self.flush().await?;
        let actual = format!("sha256:{}", hex::encode(std::mem::take(&mut self.hasher).finalize()));
        verify(&self.digest, Some(self.size), self.offset, &actual)?;
        let (file, path, target, digest) =
            (self.file.clone(), self.path.clone(), self.target.clone(), self.digest.clone());
        tokio::task::spawn_blocking(move || {
            file.sync_all().map_err(|e| io_error(&path, &digest, e))?;
            std::fs::rename(&path, &target).map_err(|e| io_error(&path, &digest, e))?;
            sync_dir(target.parent().unwrap_or(Path::new("/")))
        })
        .await
        .map_err(|e| ImageError::Internal(format!("ingest commit task failed: {e}")))?
    }

    /// Removes the partial file (used on errors that make its bytes worthless, e.g. a full disk).
    pub(crate) fn discard(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, ContentStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = ContentStore::open(dir.path()).unwrap();
        (dir, store)
    }

    #[tokio::test]
    async fn verified_blob_is_committed_and_readable() {
        let (_dir, store) = store();
        let data = b"hello layer".repeat(1000);
        let digest = sha256_digest(&data);
        let _guard = store.lock(&digest).await;
        let mut ingest = store.ingest(&digest, data.len() as u64).await.unwrap();
        for chunk in data.chunks(777) {
            ingest.write(chunk).await.unwrap();
        }
        ingest.commit().await.unwrap();
        assert!(store.has(&digest));
        assert_eq!(store.read(&digest).unwrap(), data);
        assert!(std::fs::read_dir(store.ingest_dir()).unwrap().next().is_none());
    }

    #[tokio::test]
    async fn corrupt_blob_is_rejected_and_never_stored() {
        let (_dir, store) = store();
        let data = b"the real bytes".to_vec();
        let digest = sha256_digest(&data);
        let mut ingest = store.ingest(&digest, data.len() as u64).await.unwrap();
        ingest.write(b"the fake bytes").await.unwrap();
        assert!(matches!(ingest.commit().await, Err(ImageError::DigestMismatch { .. })));
        assert!(!store.has(&digest));
        assert!(!store.ingest_dir().join(digest_hex(&digest)).exists());
        // The in-memory path verifies too.
        assert!(matches!(store.put(&digest, None, b"other").await, Err(ImageError::DigestMismatch { .. })));
        assert!(!store.has(&digest));
    }

    #[tokio::test]
    async fn truncated_or_oversized_blob_is_rejected() {
        let (_dir, store) = store();
        let data = b"0123456789".to_vec();
        let digest = sha256_digest(&data);
        let mut ingest = store.ingest(&digest, 10).await.unwrap();
        ingest.write(&data[..6]).await.unwrap();
        match ingest.commit().await {
            Err(ImageError::DigestMismatch { reason, .. }) => {
                assert!(reason.contains("got 6 bytes, expected 10"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        let mut ingest = store.ingest(&digest, 10).await.unwrap();
        assert_eq!(ingest.offset(), 0);
        assert!(matches!(ingest.write(b"0123456789AB").await, Err(ImageError::DigestMismatch { .. })));
        assert!(matches!(store.put(&digest, Some(11), &data).await, Err(ImageError::DigestMismatch { .. })));
        assert!(!store.has(&digest));
    }

    #[tokio::test]
    async fn interrupted_ingest_resumes_from_its_bytes() {
        let (dir, store) = store();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let digest = sha256_digest(&data);
        let mut ingest = store.ingest(&digest, data.len() as u64).await.unwrap();
        ingest.write(&data[..2_000_000]).await.unwrap();
        ingest.flush().await.unwrap();
        drop(ingest);
        // Reopening the store keeps the partial ingest.
        let store = ContentStore::open(dir.path()).unwrap();
        let mut ingest = store.ingest(&digest, data.len() as u64).await.unwrap();
        assert_eq!(ingest.offset(), 2_000_000);
        ingest.write(&data[2_000_000..]).await.unwrap();
        ingest.commit().await.unwrap();
        assert_eq!(std::fs::read(store.blob_path(&digest)).unwrap(), data);
    }

    #[tokio::test]
    async fn blob_corrupted_on_disk_is_removed_when_read() {
        let (_dir, store) = store();
        let digest = sha256_digest(b"config");
        store.put(&digest, Some(6), b"config").await.unwrap();
        std::fs::write(store.blob_path(&digest), b"CONFIG").unwrap();
        assert!(matches!(store.read(&digest), Err(ImageError::DigestMismatch { .. })));
        assert!(!store.has(&digest));
    }

    #[test]
    fn full_disk_is_no_space() {
        let e = io_error(Path::new("/x"), "layer", std::io::Error::from_raw_os_error(nix::libc::ENOSPC));
        assert!(matches!(e, ImageError::NoSpace { .. }));
    }
}
