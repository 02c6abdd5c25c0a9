//! CRI ImageService as plain async methods: images are (image, handler) tuples, the empty handler
//! is the default one, and every record carries its handler in `Image.spec.runtime_handler`.

use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use berth_image::{Credentials, ImageRecord, Platform, Progress};
use k8s_cri::v1 as cri;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{Cri, Error};

/// A pull running in the background: its progress, then its result. The pull finishes even when
/// nobody waits for it any more (a client that gave up will find the image on its next try).
pub struct PullTask {
    pub handler: String,
    progress: mpsc::UnboundedReceiver<Progress>,
    result: JoinHandle<Result<ImageRecord, Error>>,
}

impl PullTask {
    /// The next progress event; `None` once the pull has ended.
    pub async fn next_progress(&mut self) -> Option<Progress> {
        self.progress.recv().await
    }

    pub async fn finish(self) -> Result<ImageRecord, Error> {
        self.result.await.map_err(Error::Task)?
    }
}

impl Cri {
    pub async fn list_images(&self, req: cri::ListImagesRequest) -> Result<cri::ListImagesResponse, Error> {
        let spec = req.filter.and_then(|f| f.image).unwrap_or_default();
        let handler = match spec.runtime_handler.as_str() {
            "" => None,
            h => Some(self.handler(h)?.name.clone()),
        };
        let wanted = spec.image;
        let records = self
            .blocking(move |images| {
                let records = images
                    .list(handler.as_deref())
                    .map_err(|e| Error::image("list", &wanted, handler.as_deref().unwrap_or(""), e))?;
                if wanted.is_empty() {
                    return Ok(records);
                }
                // What the reference resolves to for each handler, looked up once per handler.
                let mut resolved: BTreeMap<String, Option<String>> = BTreeMap::new();
                let mut out = Vec::new();
                for r in records {
                    if !resolved.contains_key(&r.handler) {
                        let found = images
                            .status(&wanted, &r.handler)
                            .map_err(|e| Error::image("list", &wanted, &r.handler, e))?;
                        resolved.insert(r.handler.clone(), found.map(|f| f.id));
                    }
                    if resolved[&r.handler].as_deref() == Some(r.id.as_str()) || names_repository(&r, &wanted) {
                        out.push(r);
                    }
                }
                Ok(out)
            })
            .await?;
        Ok(cri::ListImagesResponse { images: records.iter().map(to_cri_image).collect() })
    }

    pub async fn image_status(&self, req: cri::ImageStatusRequest) -> Result<cri::ImageStatusResponse, Error> {
        let spec = required_spec(req.image)?;
        let handler = self.handler(&spec.runtime_handler)?.name.clone();
        let record = self
            .blocking(move |images| {
                images.status(&spec.image, &handler).map_err(|e| Error::image("look up", &spec.image, &handler, e))
            })
            .await?;
        let info = match &record {
            Some(r) if req.verbose => verbose_info(r),
            _ => HashMap::new(),
        };
        Ok(cri::ImageStatusResponse { image: record.as_ref().map(to_cri_image), info })
    }

    pub async fn pull_image(&self, req: cri::PullImageRequest) -> Result<cri::PullImageResponse, Error> {
        let spec = required_spec(req.image)?;
        let handler = self.handler(&spec.runtime_handler)?.name.clone();
        let record = self
            .spawn_pull(&spec.image, &handler, req.auth.and_then(credentials), None)
            .await
            .map_err(Error::Task)??;
        Ok(cri::PullImageResponse { image_ref: record.id })
    }

    /// Starts a pull that reports progress; an unknown handler or empty reference fails here,
    /// before anything is fetched.
    pub fn start_pull(&self, image: &str, handler: &str, auth: Option<cri::AuthConfig>) -> Result<PullTask, Error> {
        if image.is_empty() {
            return Err(Error::InvalidArgument("image reference is empty".into()));
        }
        let handler = self.handler(handler)?.name.clone();
        let (tx, progress) = mpsc::unbounded_channel();
        let result = self.spawn_pull(image, &handler, auth.and_then(credentials), Some(tx));
        Ok(PullTask { handler, progress, result })
    }

    fn spawn_pull(
        &self,
        image: &str,
        handler: &str,
        credentials: Option<Credentials>,
        progress: Option<mpsc::UnboundedSender<Progress>>,
    ) -> JoinHandle<Result<ImageRecord, Error>> {
        let images = std::sync::Arc::clone(&self.images);
        let (image, handler) = (image.to_string(), handler.to_string());
        tokio::spawn(async move {
            tracing::debug!(image, handler, "pulling image");
            images
                .pull(&image, &handler, credentials, progress)
                .await
                .map_err(|e| Error::image("pull", &image, &handler, e))
        })
    }

    pub async fn remove_image(&self, req: cri::RemoveImageRequest) -> Result<cri::RemoveImageResponse, Error> {
        let spec = required_spec(req.image)?;
        let handler = self.handler(&spec.runtime_handler)?.name.clone();
        self.blocking(move |images| {
            tracing::info!(image = spec.image, handler, "removing image");
            images.remove(&spec.image, &handler).map_err(|e| Error::image("remove", &spec.image, &handler, e))
        })
        .await?;
        Ok(cri::RemoveImageResponse {})
    }

    pub async fn image_fs_info(&self) -> Result<cri::ImageFsInfoResponse, Error> {
        let (usage, root) = self
            .blocking(|images| Ok((images.fs_usage().map_err(|e| Error::FsUsage(Box::new(e)))?, images.root())))
            .await?;
        let timestamp = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
            .unwrap_or(1);
        Ok(cri::ImageFsInfoResponse {
            image_filesystems: vec![cri::FilesystemUsage {
                timestamp,
                fs_id: Some(cri::FilesystemIdentifier { mountpoint: root.display().to_string() }),
                used_bytes: Some(cri::UInt64Value { value: usage.used_bytes }),
                inodes_used: Some(cri::UInt64Value { value: usage.inodes_used }),
            }],
            container_filesystems: Vec::new(),
        })
    }
}

fn required_spec(spec: Option<cri::ImageSpec>) -> Result<cri::ImageSpec, Error> {
    match spec {
        Some(s) if !s.image.is_empty() => Ok(s),
        _ => Err(Error::InvalidArgument("image reference is empty".into())),
    }
}

/// CRI `AuthConfig` → registry credentials; an all-empty one is no credentials.
fn credentials(a: cri::AuthConfig) -> Option<Credentials> {
    let c = Credentials {
        username: a.username,
        password: a.password,
        auth: a.auth,
        identity_token: a.identity_token,
        registry_token: a.registry_token,
    };
    let empty = [&c.username, &c.password, &c.auth, &c.identity_token, &c.registry_token].iter().all(|s| s.is_empty());
    (!empty).then_some(c)
}

/// Whether `wanted` is the repository (without tag or digest) of one of the record's names.
fn names_repository(r: &ImageRecord, wanted: &str) -> bool {
    let tags = r.repo_tags.iter().filter_map(|t| t.rsplit_once(':').map(|(repo, _)| repo));
    let digests = r.repo_digests.iter().filter_map(|d| d.split_once('@').map(|(repo, _)| repo));
    tags.chain(digests).any(|repo| repo == wanted)
}

/// The record as CRI's `Image`, handler in `spec.runtime_handler`.
pub(crate) fn to_cri_image(r: &ImageRecord) -> cri::Image {
    let user = r.config.pointer("/config/User").and_then(|u| u.as_str()).unwrap_or("");
    let (uid, username) = image_user(user);
    cri::Image {
        id: r.id.clone(),
        repo_tags: r.repo_tags.clone(),
        repo_digests: r.repo_digests.clone(),
        size: r.size,
        uid: uid.map(|value| cri::Int64Value { value }),
        username,
        spec: Some(cri::ImageSpec {
            image: r.id.clone(),
            annotations: HashMap::new(),
            user_specified_image: r.repo_tags.first().cloned().unwrap_or_default(),
            runtime_handler: r.handler.clone(),
        }),
        pinned: r.pinned,
    }
}

/// The image config's `User` as CRI wants it (containerd's rule): a numeric user is a uid, any
/// other a user name; the group part is dropped; unset is neither.
fn image_user(user: &str) -> (Option<i64>, String) {
    let user = user.split(':').next().unwrap_or("");
    if user.is_empty() {
        return (None, String::new());
    }
    match user.parse::<i64>() {
        Ok(uid) => (Some(uid), String::new()),
        Err(_) => (None, user.to_string()),
    }
}

/// A platform in OCI's JSON spelling (`os.version`, `os.features`).
fn oci_platform(p: &Platform) -> serde_json::Value {
    let mut v = json!({ "architecture": p.architecture, "os": p.os });
    if let Some(version) = &p.os_version {
        v["os.version"] = json!(version);
    }
    if !p.os_features.is_empty() {
        v["os.features"] = json!(p.os_features);
    }
    if let Some(variant) = &p.variant {
        v["variant"] = json!(variant);
    }
    v
}

/// `ImageStatus` verbose info: one `info` key holding JSON, as containerd does, so crictl's
/// `inspecti` shows it under `info`.
fn verbose_info(r: &ImageRecord) -> HashMap<String, String> {
    let platform = oci_platform(&r.platform);
    let info = json!({
        "runtimeHandler": r.handler,
        "manifestDigest": r.manifest_digest,
        "platform": platform,
        "chosenPlatform": platform,
        "diffIDs": r.diff_ids,
        "config": r.config.get("config").cloned().unwrap_or_else(|| json!({})),
        "imageSpec": r.config,
    });
    HashMap::from([("info".to_string(), info.to_string())])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> ImageRecord {
        ImageRecord {
            id: "sha256:abc".into(),
            handler: "gvisor".into(),
            repo_tags: vec!["127.0.0.1:5000/multi:1.0".into()],
            repo_digests: vec!["127.0.0.1:5000/multi@sha256:def".into()],
            manifest_digest: "sha256:123".into(),
            size: 4096,
            platform: Platform {
                os: "linux".into(),
                architecture: "arm64".into(),
                variant: Some("v8".into()),
                os_version: None,
                os_features: vec![],
            },
            config: json!({"architecture": "arm64", "os": "linux", "config": {"User": "1000:1000", "Env": ["A=b"]}}),
            diff_ids: vec!["sha256:d1".into()],
            pinned: false,
        }
    }

    #[test]
    fn records_become_cri_images_with_their_handler() {
        let i = to_cri_image(&record());
        assert_eq!(i.id, "sha256:abc");
        assert_eq!(i.size, 4096);
        assert_eq!(i.uid, Some(cri::Int64Value { value: 1000 }));
        assert_eq!(i.username, "");
        let spec = i.spec.unwrap();
        assert_eq!(spec.runtime_handler, "gvisor");
        assert_eq!(spec.image, "sha256:abc");
        assert_eq!(spec.user_specified_image, "127.0.0.1:5000/multi:1.0");
    }

    #[test]
    fn image_user_is_a_uid_or_a_name() {
        assert_eq!(image_user(""), (None, String::new()));
        assert_eq!(image_user("0"), (Some(0), String::new()));
        assert_eq!(image_user("nobody:nogroup"), (None, "nobody".to_string()));
        assert_eq!(image_user(":5"), (None, String::new()));
    }

    #[test]
    fn verbose_info_carries_spec_platform_and_manifest() {
        let info = verbose_info(&record());
        let v: serde_json::Value = serde_json::from_str(&info["info"]).unwrap();
        assert_eq!(v["platform"], json!({"architecture": "arm64", "os": "linux", "variant": "v8"}));
        assert_eq!(v["chosenPlatform"], v["platform"]);
        assert_eq!(v["manifestDigest"], "sha256:123");
        assert_eq!(v["imageSpec"]["config"]["Env"][0], "A=b");
        assert_eq!(v["config"]["User"], "1000:1000");
        assert_eq!(v["runtimeHandler"], "gvisor");
    }

    #[test]
    fn filters_match_repository_names_and_not_prefixes() {
        let r = record();
        assert!(names_repository(&r, "127.0.0.1:5000/multi"));
        assert!(!names_repository(&r, "127.0.0.1:5000/mult"));
        assert!(!names_repository(&r, "127.0.0.1"));
    }

    #[test]
    fn empty_auth_is_no_credentials() {
        assert!(credentials(cri::AuthConfig::default()).is_none());
        let c = credentials(cri::AuthConfig { username: "u".into(), password: "p".into(), ..Default::default() });
        assert_eq!(c.map(|c| (c.username, c.password)), Some(("u".into(), "p".into())));
    }
}
