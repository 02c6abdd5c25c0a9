//! The records' files: atomic writes (temp, fsync, rename), removal, loading a directory of records
//! at startup, and the lenient decoding of stored CRI configs.
//!
//! Durability: a record survives `berth runtime` dying at any point (its writes are in the page
//! cache). Against a host crash, the write that ends an RPC ([`Sync::Data`]) syncs the file's data,
//! so a rename never exposes an empty record; the writes before it within the same RPC
//! ([`Sync::PageCache`]) are not synced, since until the RPC answers nobody relies on them, and
//! directories are not synced (three fsyncs per write cost more than the rest of a pod's
//! bookkeeping). After a power loss a record may be a few writes older, a removed one may be back,
//! or one that was never acknowledged may be empty (recovery skips it and reports it): no
//! container survives a reboot anyway, and recovery reconciles every record with what runs,
//! marking it exited or unknown.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::StateError;
use super::is_valid_id;

/// How far a record write goes before it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sync {
    /// The file's data reaches the disk before the rename: the write that an RPC acknowledges.
    Data,
    /// The page cache only: a write that an RPC makes before the one it acknowledges.
    PageCache,
}

/// Replaces `path` with `bytes` so that a crash leaves the old file or the new one, never a mix;
/// creates the record's directory first.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], sync: Sync) -> Result<(), StateError> {
    let dir = path.parent().expect("a record file lives in its record's directory");
    match fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(StateError::io("creating", dir)(e)),
    }
    let name = path.file_name().expect("a record file has a name").to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp"));
    let written = (|| {
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        match sync {
            Sync::Data => file.sync_data(),
            Sync::PageCache => Ok(()),
        }
    })();
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(StateError::io("writing", path)(e));
    }
    Ok(())
}

/// Removes a record's file (the record is gone once this returns), then its directory if the
/// layer above left nothing else in it.
pub(crate) fn remove_record(path: &Path) -> Result<(), StateError> {
    let dir = path.parent().expect("a record file lives in its record's directory");
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(StateError::io("removing", path)(e)),
    }
    match fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        // Other files there (a bundle, resolv.conf) are the RPC layer's to clean up; recovery
        // reports such directories as stray.
        Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::DirectoryNotEmpty) => Ok(()),
        Err(e) => Err(StateError::io("removing", dir)(e)),
    }
}

/// A record file that recovery could not load; its directory is left untouched for inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub path: PathBuf,
    pub reason: String,
}

/// What [`load_all`] found in one records directory.
pub(crate) struct Loaded<R> {
    pub records: Vec<R>,
    pub skipped: Vec<Skipped>,
    /// Record directories without a record file: a removal the layer above did not finish.
    pub stray: Vec<PathBuf>,
}

/// Loads every `<dir>/<id>/<file>`; a file that does not parse, or whose id is not its
/// directory's name, is skipped and reported, never fatal.
pub(crate) fn load_all<R: DeserializeOwned>(
    dir: &Path,
    file: &str,
    id_of: impl Fn(&R) -> &str,
) -> Result<Loaded<R>, StateError> {
    let mut loaded = Loaded { records: Vec::new(), skipped: Vec::new(), stray: Vec::new() };
    let entries = fs::read_dir(dir).map_err(StateError::io("reading", dir))?;
    for entry in entries {
        let entry = entry.map_err(StateError::io("reading", dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let record_dir = entry.path();
        if !is_valid_id(&name) {
            loaded.skipped.push(Skipped { path: record_dir, reason: "not a record directory".into() });
            continue;
        }
        // A temporary file is a write that a crash interrupted before its rename: the record
        // file (if any) still holds the previous version.
        let _ = fs::remove_file(record_dir.join(format!(".{file}.tmp")));
        let path = record_dir.join(file);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                loaded.stray.push(record_dir);
                continue;
            }
            Err(e) => {
                loaded.skipped.push(Skipped { path, reason: format!("reading: {e}") });
                continue;
            }
        };
        match serde_json::from_slice::<R>(&bytes) {
            Ok(record) if id_of(&record) == name => loaded.records.push(record),
            Ok(record) => {
                let reason = format!("the record's id {:?} is not its directory's name", id_of(&record));
                loaded.skipped.push(Skipped { path, reason });
            }
            Err(e) => loaded.skipped.push(Skipped { path, reason: format!("parsing: {e}") }),
        }
    }
    Ok(loaded)
}

/// Decodes a stored CRI config after filling in, from `T::default()`, the fields it lacks:
/// k8s-cri's serde derives have no `#[serde(default)]`, so a field that a newer k8s-cri added
/// would otherwise make every older record undecodable. (Fields added inside a nested message
/// that was set are not filled: a stored config then fails to decode, while its record still
/// loads, since the record keeps the config as plain JSON.)
pub(crate) fn decode_config<T: Default + Serialize + DeserializeOwned>(
    stored: &serde_json::Value,
) -> serde_json::Result<T> {
    let mut full = serde_json::to_value(T::default())?;
    overlay(&mut full, stored);
    serde_json::from_value(full)
}

fn overlay(base: &mut serde_json::Value, top: &serde_json::Value) {
    use serde_json::Value;
    match (base, top) {
        (Value::Object(base), Value::Object(top)) => {
            for (key, value) in top {
                match base.get_mut(key) {
                    Some(slot) => overlay(slot, value),
                    None => {
                        base.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (base, top) => *base = top.clone(),
    }
}

#[cfg(test)]
mod tests {
    use k8s_cri::v1 as cri;

    use super::*;

    #[test]
    fn an_atomic_write_creates_the_directory_and_leaves_no_temporary_file() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("abc").join("r.json");
        write_atomic(&path, b"one", Sync::PageCache).unwrap();
        write_atomic(&path, b"two", Sync::Data).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::read_dir(path.parent().unwrap()).unwrap().count(), 1);
    }

    #[test]
    fn removing_a_record_keeps_a_directory_that_still_has_other_files() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("abc").join("r.json");
        write_atomic(&path, b"x", Sync::Data).unwrap();
        fs::write(root.path().join("abc").join("resolv.conf"), b"").unwrap();
        remove_record(&path).unwrap();
        assert!(!path.exists() && root.path().join("abc").exists());
        fs::remove_file(root.path().join("abc").join("resolv.conf")).unwrap();
        write_atomic(&path, b"x", Sync::Data).unwrap();
        remove_record(&path).unwrap();
        assert!(!root.path().join("abc").exists());
        remove_record(&path).unwrap();
    }

    #[test]
    fn a_config_missing_fields_decodes_with_their_defaults() {
        // As a record written before k8s-cri grew `hostname` (and most else) would hold it.
        let stored = serde_json::json!({ "metadata": { "name": "web", "uid": "u", "namespace": "n", "attempt": 1 } });
        let c: cri::PodSandboxConfig = decode_config(&stored).unwrap();
        assert_eq!(c.metadata.unwrap().attempt, 1);
        assert_eq!(c.hostname, "");
    }

    #[test]
    fn a_config_with_fields_unknown_to_this_version_still_decodes() {
        let stored = serde_json::json!({ "hostname": "h", "added_by_a_newer_berth": true });
        let c: cri::PodSandboxConfig = decode_config(&stored).unwrap();
        assert_eq!(c.hostname, "h");
    }
}
