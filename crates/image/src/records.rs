//! Image records, one JSON file per (image id, handler) under `records/<handler>/<id hex>.json`,
//! written atomically; lookups by tag, digest reference, id or id prefix within one handler; and
//! moving a tag to the image it now names.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::content::{digest_hex, io_error, sync_dir, unique_suffix};
use crate::reference::Reference;
use crate::{ImageError, ImageRecord};

/// A record as stored: the public record plus every blob it keeps alive.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Stored {
    pub record: ImageRecord,
    /// Index (if any), manifest, config and layer blob digests.
    pub blobs: Vec<String>,
}

pub(crate) struct Records {
    dir: PathBuf,
    items: Mutex<Vec<Stored>>,
}

impl Records {
    /// Loads every record; unreadable files and leftover temp files are removed.
    pub(crate) fn open(root: &Path) -> Result<Self, ImageError> {
        let dir = root.join("records");
        std::fs::create_dir_all(&dir).map_err(|e| io_error(&dir, "records", e))?;
        let mut items = Vec::new();
        let handlers = std::fs::read_dir(&dir).map_err(|e| io_error(&dir, "records", e))?;
        for handler_dir in handlers.flatten() {
            let Ok(files) = std::fs::read_dir(handler_dir.path()) else { continue };
            for file in files.flatten() {
                let path = file.path();
                if path.extension().and_then(|e| e.to_str()) != Some("json") {
                    debug!(path = %path.display(), "removing leftover record temp file");
                    let _ = std::fs::remove_file(&path);
                    continue;
                }
                match std::fs::read(&path).map(|b| serde_json::from_slice::<Stored>(&b)) {
                    Ok(Ok(stored)) => items.push(stored),
                    Ok(Err(e)) => {
                        warn!(path = %path.display(), error = %e, "removing unreadable image record");
                        let _ = std::fs::remove_file(&path);
                    }
                    Err(e) => return Err(io_error(&path, "image record", e)),
                }
            }
        }
        items.sort_by(|a, b| (&a.record.handler, &a.record.id).cmp(&(&b.record.handler, &b.record.id)));
        Ok(Records { dir, items: Mutex::new(items) })
    }

    fn path(&self, handler: &str, id: &str) -> PathBuf {
        self.dir.join(handler).join(format!("{}.json", digest_hex(id)))
    }

    fn write(&self, stored: &Stored) -> Result<(), ImageError> {
        let path = self.path(&stored.record.handler, &stored.record.id);
        let dir = path.parent().unwrap_or(&self.dir).to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|e| io_error(&dir, "records", e))?;
        let tmp = dir.join(format!(".{}.{}.tmp", digest_hex(&stored.record.id), unique_suffix()));
        let bytes =
            serde_json::to_vec_pretty(stored).map_err(|e| ImageError::Internal(format!("encoding record: {e}")))?;
        let written = (|| {
            use std::io::Write as _;
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(io_error(&path, "image record", e));
        }
        sync_dir(&dir)
    }

    fn unlink(&self, handler: &str, id: &str) -> Result<(), ImageError> {
        let path = self.path(handler, id);
        match std::fs::remove_file(&path) {
            Ok(()) => sync_dir(path.parent().unwrap_or(&self.dir)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(&path, "image record", e)),
        }
    }

    pub(crate) fn all(&self) -> Vec<Stored> {
        self.items.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Records the result of a pull: merged into the record of the same (id, handler) if any,
    /// and the tag taken away from any other image of that handler that had it (an image left
    /// with neither tags nor digests is removed).
    pub(crate) fn commit_pull(&self, new: Stored) -> Result<ImageRecord, ImageError> {
        let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        let handler = new.record.handler.clone();
        let id = new.record.id.clone();
        let mut merged = new.clone();
        if let Some(old) = items.iter().find(|s| s.record.handler == handler && s.record.id == id) {
            merged.record.pinned = old.record.pinned;
            for tag in &old.record.repo_tags {
                if !merged.record.repo_tags.contains(tag) {
                    merged.record.repo_tags.push(tag.clone());
                }
            }
            for digest in &old.record.repo_digests {
                if !merged.record.repo_digests.contains(digest) {
                    merged.record.repo_digests.push(digest.clone());
                }
            }
            for blob in &old.blobs {
                if !merged.blobs.contains(blob) {
                    merged.blobs.push(blob.clone());
                }
            }
        }
        self.write(&merged)?;
        let mut emptied = Vec::new();
        for other in items.iter_mut().filter(|s| s.record.handler == handler && s.record.id != id) {
            let before = other.record.repo_tags.len();
            other.record.repo_tags.retain(|t| !new.record.repo_tags.contains(t));
            if other.record.repo_tags.len() == before {
                continue;
            }
            debug!(handler, from = %other.record.id, to = %id, "tag moved to the newly pulled image");
            if other.record.repo_tags.is_empty() && other.record.repo_digests.is_empty() {
                emptied.push(other.record.id.clone());
            } else {
                self.write(other)?;
            }
        }
        for old_id in &emptied {
            self.unlink(&handler, old_id)?;
        }
        items.retain(|s| !(s.record.handler == handler && (s.record.id == id || emptied.contains(&s.record.id))));
        items.push(merged.clone());
        items.sort_by(|a, b| (&a.record.handler, &a.record.id).cmp(&(&b.record.handler, &b.record.id)));
        Ok(merged.record)
    }

    pub(crate) fn remove(&self, handler: &str, id: &str) -> Result<(), ImageError> {
        let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        self.unlink(handler, id)?;
        items.retain(|s| !(s.record.handler == handler && s.record.id == id));
        Ok(())
    }

    /// The image of `handler` that `image` names: a full id (`sha256:<hex>` or `<hex>`), a tag
    /// or digest reference (normalized: `busybox` is `docker.io/library/busybox:latest`), or a
    /// unique id prefix.
    pub(crate) fn find(&self, handler: &str, image: &str) -> Option<ImageRecord> {
        let items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        let mine: Vec<&ImageRecord> = items.iter().map(|s| &s.record).filter(|r| r.handler == handler).collect();
        let hex = image.strip_prefix("sha256:").unwrap_or(image);
        let is_hex = !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if is_hex && hex.len() == 64 {
            return mine.into_iter().find(|r| digest_hex(&r.id) == hex).cloned();
        }
        if let Ok(reference) = Reference::parse(image) {
            let found = match (&reference.digest, reference.tagged()) {
                (Some(digest), _) => mine.iter().find(|r| {
                    r.repo_digests.contains(&reference.with_digest(digest))
                        || (r.manifest_digest == *digest
                            && r.repo_digests.iter().any(|d| d.starts_with(&reference.name())))
                }),
                (None, Some(tagged)) => mine.iter().find(|r| r.repo_tags.contains(&tagged)),
                (None, None) => None,
            };
            if let Some(found) = found {
                return Some((*found).clone());
            }
        }
        if is_hex {
            let mut matching = mine.into_iter().filter(|r| digest_hex(&r.id).starts_with(hex));
            if let (Some(only), None) = (matching.next(), matching.next()) {
                return Some(only.clone());
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Platform;

    fn record(id_char: char, handler: &str, tags: &[&str]) -> Stored {
        let id = format!("sha256:{}", id_char.to_string().repeat(64));
        Stored {
            record: ImageRecord {
                id: id.clone(),
                handler: handler.into(),
                repo_tags: tags.iter().map(|t| t.to_string()).collect(),
                repo_digests: vec![format!("docker.io/library/busybox@sha256:{}", "d".repeat(64))],
                manifest_digest: format!("sha256:{}", "e".repeat(64)),
                size: 1,
                platform: Platform::host(),
                config: serde_json::json!({}),
                diff_ids: vec![],
                pinned: false,
            },
            blobs: vec![id],
        }
    }

    #[test]
    fn lookups_use_tags_digests_ids_and_prefixes_within_one_handler() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::open(dir.path()).unwrap();
        records.commit_pull(record('a', "runc", &["docker.io/library/busybox:latest"])).unwrap();
        records.commit_pull(record('b', "gvisor", &["docker.io/library/busybox:latest"])).unwrap();
        let id = |r: Option<ImageRecord>| r.map(|r| r.id.chars().last().unwrap());
        assert_eq!(id(records.find("runc", "busybox")), Some('a'));
        assert_eq!(id(records.find("gvisor", "busybox:latest")), Some('b'));
        assert_eq!(id(records.find("runc", &format!("busybox@sha256:{}", "d".repeat(64)))), Some('a'));
        assert_eq!(id(records.find("runc", &format!("sha256:{}", "a".repeat(64)))), Some('a'));
        assert_eq!(id(records.find("runc", &"a".repeat(64))), Some('a'));
        assert_eq!(id(records.find("runc", "aaaa")), Some('a'));
        assert_eq!(id(records.find("runc", &"b".repeat(64))), None);
        assert_eq!(id(records.find("runc", "busybox:other")), None);
        // Reloaded from disk, the same.
        let records = Records::open(dir.path()).unwrap();
        assert_eq!(records.all().len(), 2);
        assert_eq!(id(records.find("gvisor", "docker.io/library/busybox")), Some('b'));
    }

    #[test]
    fn repulling_a_tag_moves_it_to_the_new_image() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::open(dir.path()).unwrap();
        records.commit_pull(record('a', "runc", &["docker.io/library/app:1", "docker.io/library/app:latest"])).unwrap();
        let mut no_digest = record('c', "runc", &["docker.io/library/other:1"]);
        no_digest.record.repo_digests.clear();
        records.commit_pull(no_digest).unwrap();
        records.commit_pull(record('b', "runc", &["docker.io/library/app:latest"])).unwrap();
        let old = records.find("runc", &"a".repeat(64)).unwrap();
        assert_eq!(old.repo_tags, vec!["docker.io/library/app:1"]);
        assert_eq!(records.find("runc", "app").unwrap().id, format!("sha256:{}", "b".repeat(64)));
        // An image left with neither tags nor digests goes away.
        records.commit_pull(record('d', "runc", &["docker.io/library/other:1"])).unwrap();
        assert!(records.find("runc", &"c".repeat(64)).is_none());
        assert!(!records.path("runc", &"c".repeat(64)).exists());
        // Same id again: tags merge.
        let merged = records.commit_pull(record('b', "runc", &["docker.io/library/app:2"])).unwrap();
        assert_eq!(merged.repo_tags, vec!["docker.io/library/app:2", "docker.io/library/app:latest"]);
    }
}
