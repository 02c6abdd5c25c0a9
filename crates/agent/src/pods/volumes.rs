//! A pod's volumes on the node: `emptyDir` (disk or tmpfs), `hostPath` (with its type checks),
//! and `configMap`, `secret`, `downwardAPI` and `projected` (service account tokens included,
//! fetched beforehand into [`Sources`]) written as files in kubelet's atomic
//! layout (`..data` → a timestamped directory, one symlink per top-level entry); the mounts each
//! container gets (`subPath`, `subPathExpr`, read-only, propagation); cleanup when the pod goes.
//!
//! Layout: `<root>/pods/<uid>/volumes/kubernetes.io~<plugin>/<name>`, as kubelet's.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1 as core;

use super::env::{self, PodContext, Sources};
use super::mount::Mounter;
use super::tokens::TokenKey;

/// Why a volume could not be set up; the pod's event reason is `FailedMount`.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("configmap {0:?} not found")]
    ConfigMapNotFound(String),
    #[error("secret {0:?} not found")]
    SecretNotFound(String),
    #[error("configmap references non-existent config key: {0}")]
    ConfigMapKeyNotFound(String),
    #[error("references non-existent secret key: {0}")]
    SecretKeyNotFound(String),
    #[error("hostPath type check failed: {path} is not a {expected}")]
    HostPathType { path: String, expected: &'static str },
    /// kubelet's wording, with the TokenRequest's failure as it reads.
    #[error("failed to fetch token: {0}")]
    Token(String),
    #[error("volume type {0} is not supported by berth's agent")]
    Unsupported(&'static str),
    #[error("invalid path {0:?}: must be relative and must not contain '..'")]
    InvalidPath(String),
    #[error(transparent)]
    Field(#[from] env::ConfigError),
    #[error("{action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> VolumeError + 'a {
    move |source| VolumeError::Io { action, path: path.to_path_buf(), source }
}

/// One volume ready on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prepared {
    pub host_path: PathBuf,
    /// configMap, secret, downwardAPI and projected volumes are always mounted read-only.
    pub read_only: bool,
    /// Files written through `..data` symlinks: a subPath into it is resolved before mounting.
    pub atomic: bool,
}

/// `<root>/pods/<uid>`.
pub fn pod_dir(root: &Path, uid: &str) -> PathBuf {
    root.join("pods").join(uid)
}

fn plugin_dir(kind: &str) -> &'static str {
    match kind {
        "emptyDir" => "kubernetes.io~empty-dir",
        "configMap" => "kubernetes.io~configmap",
        "secret" => "kubernetes.io~secret",
        "downwardAPI" => "kubernetes.io~downward-api",
        _ => "kubernetes.io~projected",
    }
}

/// The type of a volume source, by its field name.
pub fn kind(v: &core::Volume) -> &'static str {
    macro_rules! first_set {
        ($($field:ident => $name:literal),* $(,)?) => {
            $(if v.$field.is_some() { return $name; })*
        };
    }
    first_set!(
        empty_dir => "emptyDir", host_path => "hostPath", config_map => "configMap", secret => "secret",
        downward_api => "downwardAPI", projected => "projected",
        persistent_volume_claim => "persistentVolumeClaim", ephemeral => "ephemeral", csi => "csi", nfs => "nfs",
        iscsi => "iscsi", image => "image", git_repo => "gitRepo", glusterfs => "glusterfs", rbd => "rbd",
        cephfs => "cephfs", fc => "fc", flex_volume => "flexVolume", cinder => "cinder",
        aws_elastic_block_store => "awsElasticBlockStore", gce_persistent_disk => "gcePersistentDisk",
        azure_disk => "azureDisk", azure_file => "azureFile", vsphere_volume => "vsphereVolume",
        portworx_volume => "portworxVolume", scale_io => "scaleIO", storageos => "storageos",
        quobyte => "quobyte", photon_persistent_disk => "photonPersistentDisk", flocker => "flocker",
    );
    "unknown"
}

/// Names of the ConfigMaps and Secrets the pod's volumes read (with the env's, what to fetch).
pub fn referenced(spec: &core::PodSpec) -> (Vec<String>, Vec<String>) {
    let (mut cms, mut secrets) = (Vec::new(), Vec::new());
    for v in spec.volumes.iter().flatten() {
        cms.extend(v.config_map.as_ref().map(|c| c.name.clone()));
        secrets.extend(v.secret.as_ref().and_then(|s| s.secret_name.clone()));
        for source in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            cms.extend(source.config_map.as_ref().map(|c| c.name.clone()));
            secrets.extend(source.secret.as_ref().map(|s| s.name.clone()));
        }
    }
    (cms, secrets)
}

/// Kubernetes' automatic service account volume (`kube-api-access-<suffix>`): its CA ConfigMap
/// is taken as optional, so a cluster without the root-ca-cert-publisher still starts pods.
fn is_service_account_volume(v: &core::Volume) -> bool {
    v.name.starts_with("kube-api-access-")
}

/// A file of a projected volume: its bytes and mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct File {
    pub data: Vec<u8>,
    pub mode: u32,
}

const DEFAULT_MODE: i32 = 0o644;

fn mode(item: Option<i32>, default: Option<i32>) -> u32 {
    item.or(default).unwrap_or(DEFAULT_MODE) as u32 & 0o7777
}

fn check_relative(path: &str) -> Result<(), VolumeError> {
    let p = Path::new(path);
    let ok = !path.is_empty()
        && p.components().all(|c| matches!(c, Component::Normal(_)))
        && !p.components().next().is_some_and(|c| c.as_os_str().to_string_lossy().starts_with(".."));
    if ok { Ok(()) } else { Err(VolumeError::InvalidPath(path.to_string())) }
}

/// The files of configMap `name` (nothing when it is missing and `optional`).
fn config_map_files(
    sources: &Sources,
    name: &str,
    items: Option<&Vec<core::KeyToPath>>,
    default_mode: Option<i32>,
    optional: bool,
    out: &mut BTreeMap<String, File>,
) -> Result<(), VolumeError> {
    match sources.config_map(name) {
        Some(data) => key_files(data, items, default_mode, optional, VolumeError::ConfigMapKeyNotFound, out),
        None if optional => Ok(()),
        None => Err(VolumeError::ConfigMapNotFound(name.to_string())),
    }
}

/// The files of secret `name` (nothing when it is missing and `optional`).
fn secret_files(
    sources: &Sources,
    name: &str,
    items: Option<&Vec<core::KeyToPath>>,
    default_mode: Option<i32>,
    optional: bool,
    out: &mut BTreeMap<String, File>,
) -> Result<(), VolumeError> {
    match sources.secret(name) {
        Some(data) => key_files(data, items, default_mode, optional, VolumeError::SecretKeyNotFound, out),
        None if optional => Ok(()),
        None => Err(VolumeError::SecretNotFound(name.to_string())),
    }
}

/// The files of a key-to-path projection from `data` (a ConfigMap's or Secret's).
fn key_files(
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<core::KeyToPath>>,
    default_mode: Option<i32>,
    optional: bool,
    missing_key: fn(String) -> VolumeError,
    out: &mut BTreeMap<String, File>,
) -> Result<(), VolumeError> {
    match items {
        None => {
            for (k, v) in data {
                out.insert(k.clone(), File { data: v.clone(), mode: mode(None, default_mode) });
            }
        }
        Some(items) => {
            for item in items {
                check_relative(&item.path)?;
                match data.get(&item.key) {
                    Some(v) => {
                        out.insert(item.path.clone(), File { data: v.clone(), mode: mode(item.mode, default_mode) });
                    }
                    None if optional => {}
                    None => return Err(missing_key(item.key.clone())),
                }
            }
        }
    }
    Ok(())
}

fn downward_files(
    pod: &core::Pod,
    ctx: &PodContext,
    items: Option<&Vec<core::DownwardAPIVolumeFile>>,
    default_mode: Option<i32>,
    out: &mut BTreeMap<String, File>,
) -> Result<(), VolumeError> {
    for item in items.into_iter().flatten() {
        check_relative(&item.path)?;
        let value = if let Some(f) = &item.field_ref {
            env::field_value(pod, ctx, &f.field_path)?
        } else if let Some(r) = &item.resource_field_ref {
            env::resource_value(pod, ctx, r, None)?
        } else {
            String::new()
        };
        out.insert(item.path.clone(), File { data: value.into_bytes(), mode: mode(item.mode, default_mode) });
    }
    Ok(())
}

/// A projected token's mode, as kubelet's: the volume's `defaultMode`, but with an `fsGroup`
/// 0600, which kubelet's volume ownership pass then opens to the group (0640).
fn token_mode(pod: &core::Pod, default_mode: Option<i32>) -> u32 {
    let fs_group = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()).and_then(|s| s.fs_group);
    if fs_group.is_some() { 0o640 } else { mode(None, default_mode) }
}

/// The files of a configMap, secret, downwardAPI or projected volume; `None` for other types.
pub fn payload(
    pod: &core::Pod,
    v: &core::Volume,
    sources: &Sources,
    ctx: &PodContext,
) -> Result<Option<BTreeMap<String, File>>, VolumeError> {
    let mut out = BTreeMap::new();
    let lenient = is_service_account_volume(v);
    if let Some(cm) = &v.config_map {
        let optional = cm.optional == Some(true);
        config_map_files(sources, &cm.name, cm.items.as_ref(), cm.default_mode, optional, &mut out)?;
    } else if let Some(s) = &v.secret {
        let name = s.secret_name.as_deref().unwrap_or_default();
        let optional = s.optional == Some(true);
        secret_files(sources, name, s.items.as_ref(), s.default_mode, optional, &mut out)?;
    } else if let Some(d) = &v.downward_api {
        downward_files(pod, ctx, d.items.as_ref(), d.default_mode, &mut out)?;
    } else if let Some(p) = &v.projected {
        for source in p.sources.iter().flatten() {
            if let Some(cm) = &source.config_map {
                let optional = cm.optional == Some(true) || lenient;
                config_map_files(sources, &cm.name, cm.items.as_ref(), p.default_mode, optional, &mut out)?;
            } else if let Some(s) = &source.secret {
                let optional = s.optional == Some(true);
                secret_files(sources, &s.name, s.items.as_ref(), p.default_mode, optional, &mut out)?;
            } else if let Some(d) = &source.downward_api {
                downward_files(pod, ctx, d.items.as_ref(), p.default_mode, &mut out)?;
            } else if let Some(t) = &source.service_account_token {
                check_relative(&t.path)?;
                let token = match sources.tokens.get(&TokenKey::of(t)) {
                    Some(Ok(token)) => token.clone(),
                    Some(Err(why)) => return Err(VolumeError::Token(why.clone())),
                    None => return Err(VolumeError::Token("no token was requested".into())),
                };
                out.insert(t.path.clone(), File { data: token.into_bytes(), mode: token_mode(pod, p.default_mode) });
            } else if source.cluster_trust_bundle.is_some() {
                return Err(VolumeError::Unsupported("projected clusterTrustBundle"));
            }
        }
    } else {
        return Ok(None);
    }
    Ok(Some(out))
}

/// Writes `files` into `dir` the way kubelet's atomic writer does: a new timestamped directory,
/// `..data` switched to it by one rename, a symlink per top-level entry. Returns whether
/// anything changed (an identical payload is left alone).
pub fn write_atomically(dir: &Path, files: &BTreeMap<String, File>, gid: Option<u32>) -> Result<bool, VolumeError> {
    for path in files.keys() {
        check_relative(path)?;
    }
    std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    let data_link = dir.join("..data");
    let current = std::fs::read_link(&data_link).ok();
    if let Some(cur) = &current
        && same_payload(&dir.join(cur), files)
    {
        return Ok(false);
    }
    let now = jiff::Timestamp::now();
    let stamp = format!("..{}", now.strftime("%Y_%m_%d_%H_%M_%S.%f"));
    let ts_dir = dir.join(&stamp);
    std::fs::create_dir(&ts_dir).map_err(io("creating", &ts_dir))?;
    std::fs::set_permissions(&ts_dir, std::fs::Permissions::from_mode(0o755)).map_err(io("chmod", &ts_dir))?;
    for (path, file) in files {
        let target = ts_dir.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io("creating", parent))?;
        }
        std::fs::write(&target, &file.data).map_err(io("writing", &target))?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(file.mode)).map_err(io("chmod", &target))?;
        if let Some(gid) = gid {
            std::os::unix::fs::chown(&target, None, Some(gid)).map_err(io("chown", &target))?;
        }
    }
    let tmp_link = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp_link);
    symlink(&stamp, &tmp_link).map_err(io("linking", &tmp_link))?;
    std::fs::rename(&tmp_link, &data_link).map_err(io("renaming", &data_link))?;
    // One user-visible symlink per top-level name, through ..data.
    let top: Vec<String> = {
        let mut t: Vec<String> = files.keys().map(|p| p.split('/').next().unwrap_or(p).to_string()).collect();
        t.dedup();
        t
    };
    for name in &top {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            symlink(Path::new("..data").join(name), &link).map_err(io("linking", &link))?;
        }
    }
    for entry in std::fs::read_dir(dir).map_err(io("reading", dir))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("..") && !top.contains(&name) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    if let Some(old) = current {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
    Ok(true)
}

fn same_payload(dir: &Path, files: &BTreeMap<String, File>) -> bool {
    let mut count = 0usize;
    fn walk(base: &Path, dir: &Path, count: &mut usize) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(base, &p, count);
            } else {
                *count += 1;
            }
        }
        let _ = base;
    }
    walk(dir, dir, &mut count);
    count == files.len()
        && files.iter().all(|(path, f)| {
            let p = dir.join(path);
            std::fs::read(&p).is_ok_and(|d| d == f.data)
                && std::fs::metadata(&p).is_ok_and(|m| m.permissions().mode() & 0o7777 == f.mode)
        })
}

/// Checks (and for the `…OrCreate` types, creates) a hostPath as its `type` says.
pub fn check_host_path(path: &Path, type_: Option<&str>) -> Result<(), VolumeError> {
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::metadata(path);
    let fail = |expected| VolumeError::HostPathType { path: path.display().to_string(), expected };
    match type_.unwrap_or("") {
        "" => Ok(()),
        "DirectoryOrCreate" => {
            if meta.is_err() {
                std::fs::create_dir_all(path).map_err(io("creating", path))?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(io("chmod", path))?;
                return Ok(());
            }
            if meta.is_ok_and(|m| m.is_dir()) { Ok(()) } else { Err(fail("directory")) }
        }
        "Directory" => meta.is_ok_and(|m| m.is_dir()).then_some(()).ok_or_else(|| fail("directory")),
        "FileOrCreate" => {
            if meta.is_err() {
                std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(io("creating", path))?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).map_err(io("chmod", path))?;
                return Ok(());
            }
            if meta.is_ok_and(|m| m.is_file()) { Ok(()) } else { Err(fail("file")) }
        }
        "File" => meta.is_ok_and(|m| m.is_file()).then_some(()).ok_or_else(|| fail("file")),
        "Socket" => meta.is_ok_and(|m| m.file_type().is_socket()).then_some(()).ok_or_else(|| fail("socket file")),
        "CharDevice" => {
            meta.is_ok_and(|m| m.file_type().is_char_device()).then_some(()).ok_or_else(|| fail("character device"))
        }
        "BlockDevice" => {
            meta.is_ok_and(|m| m.file_type().is_block_device()).then_some(()).ok_or_else(|| fail("block device"))
        }
        _ => Err(VolumeError::Unsupported("hostPath of an unknown type")),
    }
}

/// Sets up every volume of the pod (idempotent: called again, it refreshes configMap, secret and
/// downwardAPI contents). Fails on the first volume that cannot be set up, naming it.
pub fn prepare(
    root: &Path,
    pod: &core::Pod,
    sources: &Sources,
    ctx: &PodContext,
    mounter: &dyn Mounter,
) -> Result<HashMap<String, Prepared>, (String, VolumeError)> {
    let spec = pod.spec.clone().unwrap_or_default();
    let uid = pod.metadata.uid.as_deref().unwrap_or("");
    let gid = spec.security_context.as_ref().and_then(|s| s.fs_group).and_then(|g| u32::try_from(g).ok());
    let mut out = HashMap::new();
    for v in spec.volumes.iter().flatten() {
        let prepared = prepare_one(root, uid, pod, v, sources, ctx, mounter, gid).map_err(|e| (v.name.clone(), e))?;
        out.insert(v.name.clone(), prepared);
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn prepare_one(
    root: &Path,
    uid: &str,
    pod: &core::Pod,
    v: &core::Volume,
    sources: &Sources,
    ctx: &PodContext,
    mounter: &dyn Mounter,
    gid: Option<u32>,
) -> Result<Prepared, VolumeError> {
    let kind = kind(v);
    if let Some(h) = &v.host_path {
        let path = PathBuf::from(&h.path);
        check_host_path(&path, h.type_.as_deref())?;
        return Ok(Prepared { host_path: path, read_only: false, atomic: false });
    }
    let dir = pod_dir(root, uid).join("volumes").join(plugin_dir(kind)).join(&v.name);
    if let Some(e) = &v.empty_dir {
        std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
        if e.medium.as_deref() == Some("Memory") && !mounter.is_mounted(&dir) {
            let size = e.size_limit.as_ref().and_then(|q| berth_api::validation::Quantity::parse(&q.0).ok());
            let bytes = size.and_then(|q| u64::try_from(q.0 / 1_000_000_000).ok()).filter(|b| *b > 0);
            mounter.mount_tmpfs(&dir, bytes).map_err(io("mounting tmpfs on", &dir))?;
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).map_err(io("chmod", &dir))?;
        if let Some(gid) = gid {
            std::os::unix::fs::chown(&dir, None, Some(gid)).map_err(io("chown", &dir))?;
        }
        return Ok(Prepared { host_path: dir, read_only: false, atomic: false });
    }
    let Some(files) = payload(pod, v, sources, ctx)? else {
        return Err(VolumeError::Unsupported(kind));
    };
    std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
    // Secrets and everything derived from the pod stay in memory, as kubelet keeps them.
    if kind != "configMap" && !mounter.is_mounted(&dir) {
        mounter.mount_tmpfs(&dir, None).map_err(io("mounting tmpfs on", &dir))?;
    }
    write_atomically(&dir, &files, gid)?;
    Ok(Prepared { host_path: dir, read_only: true, atomic: true })
}

/// The CRI mounts of one container. `env` expands `subPathExpr`.
pub fn container_mounts(
    c: &core::Container,
    prepared: &HashMap<String, Prepared>,
    env: &[cri::KeyValue],
) -> Result<Vec<cri::Mount>, VolumeError> {
    let mut mounts = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let Some(volume) = prepared.get(&m.name) else {
            return Err(VolumeError::InvalidPath(format!("volume {} is not defined", m.name)));
        };
        let sub = match (&m.sub_path, &m.sub_path_expr) {
            (Some(s), _) if !s.is_empty() => Some(s.clone()),
            (_, Some(expr)) if !expr.is_empty() => {
                let lookup = |name: &str| env.iter().find(|kv| kv.key == name).map(|kv| kv.value.clone());
                Some(env::expand(expr, &lookup))
            }
            _ => None,
        };
        let host_path = match sub {
            None => volume.host_path.clone(),
            Some(sub) => {
                check_relative(&sub)?;
                let path = volume.host_path.join(&sub);
                if volume.atomic {
                    // Through the ..data symlinks to the file itself, which must stay inside.
                    let real = path.canonicalize().map_err(io("resolving", &path))?;
                    let base = volume.host_path.canonicalize().map_err(io("resolving", &volume.host_path))?;
                    if !real.starts_with(&base) {
                        return Err(VolumeError::InvalidPath(sub));
                    }
                    real
                } else {
                    if std::fs::symlink_metadata(&path).is_err() {
                        std::fs::create_dir_all(&path).map_err(io("creating", &path))?;
                    }
                    path
                }
            }
        };
        let propagation = match m.mount_propagation.as_deref() {
            Some("HostToContainer") => cri::MountPropagation::PropagationHostToContainer,
            Some("Bidirectional") => cri::MountPropagation::PropagationBidirectional,
            _ => cri::MountPropagation::PropagationPrivate,
        };
        mounts.push(cri::Mount {
            container_path: m.mount_path.clone(),
            host_path: host_path.display().to_string(),
            readonly: m.read_only == Some(true) || volume.read_only,
            propagation: propagation as i32,
            ..Default::default()
        });
    }
    Ok(mounts)
}

/// Removes the pod's directory: tmpfs volumes unmounted first, so nothing of the host is touched.
pub fn clean_up(root: &Path, uid: &str, mounter: &dyn Mounter) -> std::io::Result<()> {
    let dir = pod_dir(root, uid);
    let volumes = dir.join("volumes");
    for plugin in std::fs::read_dir(&volumes).into_iter().flatten().flatten() {
        for volume in std::fs::read_dir(plugin.path()).into_iter().flatten().flatten() {
            let path = volume.path();
            if mounter.is_mounted(&path) {
                mounter.unmount(&path)?;
            }
        }
    }
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::mount::RecordingMounter;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(volumes: Vec<core::Volume>, mounts: Vec<core::VolumeMount>) -> core::Pod {
        core::Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("u-1".into()),
                labels: Some(BTreeMap::from([("app".into(), "web".into())])),
                ..Default::default()
            },
            spec: Some(core::PodSpec {
                containers: vec![core::Container {
                    name: "app".into(),
                    volume_mounts: Some(mounts),
                    ..Default::default()
                }],
                volumes: Some(volumes),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn volume(name: &str) -> core::Volume {
        core::Volume { name: name.into(), ..Default::default() }
    }

    fn mount(name: &str, path: &str) -> core::VolumeMount {
        core::VolumeMount { name: name.into(), mount_path: path.into(), ..Default::default() }
    }

    fn sources() -> Sources {
        let data = |kv: &[(&str, &str)]| Some(kv.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect());
        Sources {
            config_maps: HashMap::from([("settings".into(), data(&[("a.conf", "A"), ("b.conf", "B")]))]),
            secrets: HashMap::from([("creds".into(), data(&[("password", "hunter2")]))]),
            ..Default::default()
        }
    }

    #[test]
    fn a_config_map_volume_is_written_atomically_with_items_and_modes() {
        let root = tempfile::tempdir().unwrap();
        let mut v = volume("config");
        v.config_map = Some(core::ConfigMapVolumeSource {
            name: "settings".into(),
            items: Some(vec![core::KeyToPath { key: "a.conf".into(), path: "etc/a.conf".into(), mode: Some(0o600) }]),
            default_mode: Some(0o640),
            optional: None,
        });
        let p = pod(vec![v], vec![mount("config", "/config")]);
        let mounter = RecordingMounter::default();
        let prepared = prepare(root.path(), &p, &sources(), &PodContext::default(), &mounter).unwrap();
        let dir = root.path().join("pods/u-1/volumes/kubernetes.io~configmap/config");
        assert_eq!(prepared["config"], Prepared { host_path: dir.clone(), read_only: true, atomic: true });
        assert_eq!(std::fs::read_to_string(dir.join("etc/a.conf")).unwrap(), "A");
        assert_eq!(std::fs::read_link(dir.join("etc")).unwrap(), Path::new("..data/etc"));
        let data = std::fs::read_link(dir.join("..data")).unwrap();
        assert!(data.to_string_lossy().starts_with("..2"), "{data:?}");
        let mode = std::fs::metadata(dir.join("etc/a.conf")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(mounter.mounted.lock().unwrap().is_empty(), "configMaps live on disk");
        // The same content again changes nothing; new content switches ..data.
        let files =
            payload(&p, &p.spec.as_ref().unwrap().volumes.as_ref().unwrap()[0], &sources(), &PodContext::default())
                .unwrap()
                .unwrap();
        assert!(!write_atomically(&dir, &files, None).unwrap());
        let mut changed = files.clone();
        changed.insert("etc/a.conf".into(), File { data: b"A2".to_vec(), mode: 0o600 });
        changed.insert("new".into(), File { data: b"N".to_vec(), mode: 0o644 });
        assert!(write_atomically(&dir, &changed, None).unwrap());
        assert_eq!(std::fs::read_to_string(dir.join("etc/a.conf")).unwrap(), "A2");
        assert_eq!(std::fs::read_to_string(dir.join("new")).unwrap(), "N");
        assert_ne!(std::fs::read_link(dir.join("..data")).unwrap(), data, "the old directory is replaced");
        assert!(!dir.join(&data).exists(), "and removed");
    }

    #[test]
    fn missing_sources_and_keys_fail_unless_optional() {
        let cm = |name: &str, key: Option<&str>, optional| {
            let mut v = volume("v");
            v.config_map = Some(core::ConfigMapVolumeSource {
                name: name.into(),
                items: key.map(|k| vec![core::KeyToPath { key: k.into(), path: "x".into(), mode: None }]),
                optional,
                ..Default::default()
            });
            v
        };
        let run = |v: core::Volume| payload(&pod(vec![], vec![]), &v, &sources(), &PodContext::default());
        assert_eq!(run(cm("nope", None, None)).unwrap_err().to_string(), "configmap \"nope\" not found");
        assert_eq!(
            run(cm("settings", Some("zzz"), None)).unwrap_err().to_string(),
            "configmap references non-existent config key: zzz"
        );
        assert!(run(cm("nope", None, Some(true))).unwrap().unwrap().is_empty());
        let mut s = volume("s");
        s.secret = Some(core::SecretVolumeSource { secret_name: Some("gone".into()), ..Default::default() });
        assert_eq!(run(s).unwrap_err().to_string(), "secret \"gone\" not found");
    }

    #[test]
    fn secrets_and_downward_api_go_to_tmpfs_with_their_values() {
        let root = tempfile::tempdir().unwrap();
        let mut s = volume("creds");
        s.secret = Some(core::SecretVolumeSource { secret_name: Some("creds".into()), ..Default::default() });
        let mut d = volume("info");
        d.downward_api = Some(core::DownwardAPIVolumeSource {
            items: Some(vec![
                core::DownwardAPIVolumeFile {
                    path: "name".into(),
                    field_ref: Some(core::ObjectFieldSelector {
                        field_path: "metadata.name".into(),
                        api_version: None,
                    }),
                    ..Default::default()
                },
                core::DownwardAPIVolumeFile {
                    path: "labels".into(),
                    field_ref: Some(core::ObjectFieldSelector {
                        field_path: "metadata.labels".into(),
                        api_version: None,
                    }),
                    ..Default::default()
                },
            ]),
            default_mode: None,
        });
        let p = pod(vec![s, d], vec![]);
        let mounter = RecordingMounter::default();
        let prepared = prepare(root.path(), &p, &sources(), &PodContext::default(), &mounter).unwrap();
        assert_eq!(std::fs::read_to_string(prepared["creds"].host_path.join("password")).unwrap(), "hunter2");
        assert_eq!(std::fs::read_to_string(prepared["info"].host_path.join("name")).unwrap(), "web");
        assert_eq!(std::fs::read_to_string(prepared["info"].host_path.join("labels")).unwrap(), "app=\"web\"");
        assert_eq!(mounter.mounted.lock().unwrap().len(), 2);
        clean_up(root.path(), "u-1", &mounter).unwrap();
        assert!(mounter.mounted.lock().unwrap().is_empty(), "unmounted before removal");
        assert!(!root.path().join("pods/u-1").exists());
    }

    #[test]
    fn a_memory_empty_dir_is_a_tmpfs_of_its_size_limit() {
        let root = tempfile::tempdir().unwrap();
        let mut v = volume("cache");
        v.empty_dir = Some(core::EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity("64Mi".into())),
        });
        let mounter = RecordingMounter::default();
        let prepared =
            prepare(root.path(), &pod(vec![v], vec![]), &sources(), &PodContext::default(), &mounter).unwrap();
        let dir = root.path().join("pods/u-1/volumes/kubernetes.io~empty-dir/cache");
        assert_eq!(prepared["cache"].host_path, dir);
        assert_eq!(*mounter.mounted.lock().unwrap(), vec![(dir, Some(64 << 20))]);
    }

    #[test]
    fn host_path_types_are_checked_and_created() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("made/here");
        check_host_path(&dir, Some("DirectoryOrCreate")).unwrap();
        assert!(dir.is_dir());
        let file = root.path().join("f");
        check_host_path(&file, Some("FileOrCreate")).unwrap();
        assert!(file.is_file());
        check_host_path(&file, Some("File")).unwrap();
        let err = check_host_path(&file, Some("Directory")).unwrap_err();
        assert_eq!(err.to_string(), format!("hostPath type check failed: {} is not a directory", file.display()));
        assert!(check_host_path(&dir, Some("Socket")).is_err());
        check_host_path(&root.path().join("missing"), None).unwrap();
    }

    #[test]
    fn unsupported_volume_types_are_named() {
        let root = tempfile::tempdir().unwrap();
        let mut pvc = volume("data");
        pvc.persistent_volume_claim =
            Some(core::PersistentVolumeClaimVolumeSource { claim_name: "c".into(), read_only: None });
        let mounter = RecordingMounter::default();
        let (name, err) =
            prepare(root.path(), &pod(vec![pvc], vec![]), &sources(), &PodContext::default(), &mounter).unwrap_err();
        assert_eq!(
            (name.as_str(), err.to_string().as_str()),
            ("data", "volume type persistentVolumeClaim is not supported by berth's agent")
        );
    }

    fn api_access_volume(name: &str, default_mode: Option<i32>) -> core::Volume {
        let token = core::VolumeProjection {
            service_account_token: Some(core::ServiceAccountTokenProjection {
                path: "token".into(),
                expiration_seconds: Some(3607),
                audience: None,
            }),
            ..Default::default()
        };
        let root_ca = core::VolumeProjection {
            config_map: Some(core::ConfigMapProjection {
                name: "kube-root-ca.crt".into(),
                items: Some(vec![core::KeyToPath { key: "ca.crt".into(), path: "ca.crt".into(), mode: None }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let namespace = core::VolumeProjection {
            downward_api: Some(core::DownwardAPIProjection {
                items: Some(vec![core::DownwardAPIVolumeFile {
                    path: "namespace".into(),
                    field_ref: Some(core::ObjectFieldSelector {
                        field_path: "metadata.namespace".into(),
                        api_version: None,
                    }),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        };
        let mut v = volume(name);
        v.projected =
            Some(core::ProjectedVolumeSource { sources: Some(vec![token, root_ca, namespace]), default_mode });
        v
    }

    fn with_token(mut sources: Sources, token: Result<&str, &str>) -> Sources {
        let key = TokenKey { audience: String::new(), expiration_seconds: 3607 };
        sources.tokens.insert(key, token.map(String::from).map_err(String::from));
        sources
    }

    #[test]
    fn the_api_access_volume_holds_the_token_the_ca_and_the_namespace_in_the_atomic_layout() {
        let root = tempfile::tempdir().unwrap();
        let mut sources = with_token(sources(), Ok("jwt-1"));
        sources
            .config_maps
            .insert("kube-root-ca.crt".into(), Some(BTreeMap::from([("ca.crt".into(), b"CA".to_vec())])));
        let p = pod(vec![api_access_volume("kube-api-access-x7k2p", Some(0o644))], vec![]);
        let mounter = RecordingMounter::default();
        let prepared = prepare(root.path(), &p, &sources, &PodContext::default(), &mounter).unwrap();
        let dir = root.path().join("pods/u-1/volumes/kubernetes.io~projected/kube-api-access-x7k2p");
        assert_eq!(
            prepared["kube-api-access-x7k2p"],
            Prepared { host_path: dir.clone(), read_only: true, atomic: true }
        );
        assert_eq!(*mounter.mounted.lock().unwrap(), vec![(dir.clone(), None)], "a token lives in memory");
        for (file, content) in [("token", "jwt-1"), ("ca.crt", "CA"), ("namespace", "default")] {
            assert_eq!(std::fs::read_link(dir.join(file)).unwrap(), Path::new("..data").join(file));
            assert_eq!(std::fs::read_to_string(dir.join(file)).unwrap(), content);
            let mode = std::fs::metadata(dir.join(file)).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode, 0o644, "{file} has the volume's defaultMode");
        }
        // A refreshed token switches ..data to a new directory in one rename.
        let before = std::fs::read_link(dir.join("..data")).unwrap();
        prepare(root.path(), &p, &with_token(sources, Ok("jwt-2")), &PodContext::default(), &mounter).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("token")).unwrap(), "jwt-2");
        assert_ne!(std::fs::read_link(dir.join("..data")).unwrap(), before);
        assert!(!dir.join(&before).exists());
    }

    #[test]
    fn a_token_is_private_to_the_fs_group_and_a_missing_one_fails_the_mount_as_kubelets() {
        let mut p = pod(vec![], vec![]);
        p.spec.as_mut().unwrap().security_context =
            Some(core::PodSecurityContext { fs_group: Some(2000), ..Default::default() });
        let v = api_access_volume("kube-api-access-x7k2p", None);
        let files = payload(&p, &v, &with_token(sources(), Ok("jwt")), &PodContext::default()).unwrap().unwrap();
        assert_eq!(files["token"].mode, 0o640);
        assert_eq!(files["namespace"].mode, 0o644);
        assert!(!files.contains_key("ca.crt"), "the CA ConfigMap of the automatic volume may be missing");
        let failed = with_token(sources(), Err("serviceaccounts \"robot\" not found"));
        assert_eq!(
            payload(&p, &v, &failed, &PodContext::default()).unwrap_err().to_string(),
            "failed to fetch token: serviceaccounts \"robot\" not found"
        );
        let mut mine = api_access_volume("mine", Some(0o600));
        if let Some(t) = mine.projected.as_mut().and_then(|p| p.sources.as_mut()).and_then(|s| s.get_mut(0)) {
            t.service_account_token.as_mut().unwrap().path = "../escape".into();
        }
        let err = payload(&pod(vec![], vec![]), &mine, &with_token(sources(), Ok("jwt")), &PodContext::default());
        assert!(matches!(err, Err(VolumeError::InvalidPath(_))));
    }

    #[test]
    fn container_mounts_honour_sub_paths_read_only_and_propagation() {
        let root = tempfile::tempdir().unwrap();
        let mut cm = volume("config");
        cm.config_map = Some(core::ConfigMapVolumeSource { name: "settings".into(), ..Default::default() });
        let mut scratch = volume("scratch");
        scratch.empty_dir = Some(core::EmptyDirVolumeSource::default());
        let mut logs = mount("scratch", "/logs");
        logs.sub_path_expr = Some("logs/$(POD)".into());
        logs.mount_propagation = Some("HostToContainer".into());
        let mut one = mount("config", "/etc/a.conf");
        one.sub_path = Some("a.conf".into());
        let mut ro = mount("scratch", "/ro");
        ro.read_only = Some(true);
        let p = pod(vec![cm, scratch], vec![mount("config", "/config"), one, logs, ro]);
        let mounter = RecordingMounter::default();
        let prepared = prepare(root.path(), &p, &sources(), &PodContext::default(), &mounter).unwrap();
        let env = vec![cri::KeyValue { key: "POD".into(), value: "web".into() }];
        let c = &p.spec.as_ref().unwrap().containers[0];
        let mounts = container_mounts(c, &prepared, &env).unwrap();
        let base = root.path().join("pods/u-1/volumes");
        assert_eq!(mounts[0].host_path, base.join("kubernetes.io~configmap/config").display().to_string());
        assert!(mounts[0].readonly);
        assert!(
            mounts[1].host_path.contains("/..2"),
            "a subPath into a configMap is the file itself: {}",
            mounts[1].host_path
        );
        assert!(mounts[1].host_path.ends_with("/a.conf"));
        let logs_dir = base.join("kubernetes.io~empty-dir/scratch/logs/web");
        assert_eq!(mounts[2].host_path, logs_dir.display().to_string());
        assert!(logs_dir.is_dir(), "the subPath is created");
        assert_eq!(mounts[2].propagation, cri::MountPropagation::PropagationHostToContainer as i32);
        assert!(!mounts[2].readonly && mounts[3].readonly);
        let mut escape = mount("scratch", "/x");
        escape.sub_path = Some("../../etc".into());
        let bad = core::Container { name: "b".into(), volume_mounts: Some(vec![escape]), ..Default::default() };
        assert!(matches!(container_mounts(&bad, &prepared, &env), Err(VolumeError::InvalidPath(_))));
    }
}
