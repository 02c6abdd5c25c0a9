//! Images from the agent's side (seed `003_…`): the pull policy, registry credentials from a pod's
//! `imagePullSecrets`, and which `(image, handler)` tuples image garbage collection removes.
//!
//! Pure: secrets come in fetched; usage and last-use times come in measured.

use std::collections::HashMap;

use jiff::Timestamp;
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1 as core;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

/// The container's pull policy, defaulted from the tag as the API server does: `:latest` or no
/// tag (and no digest) pulls always.
pub fn pull_policy(c: &core::Container) -> PullPolicy {
    match c.image_pull_policy.as_deref() {
        Some("Always") => PullPolicy::Always,
        Some("Never") => PullPolicy::Never,
        Some("IfNotPresent") => PullPolicy::IfNotPresent,
        _ => {
            let image = c.image.as_deref().unwrap_or("");
            if image.contains('@') {
                return PullPolicy::IfNotPresent;
            }
            match tag(image) {
                None | Some("latest") => PullPolicy::Always,
                Some(_) => PullPolicy::IfNotPresent,
            }
        }
    }
}

/// The tag of a reference, if it has one (a `:` after the last `/`).
fn tag(image: &str) -> Option<&str> {
    let name = image.split('@').next().unwrap_or(image);
    let last = name.rsplit('/').next().unwrap_or(name);
    last.split_once(':').map(|(_, t)| t)
}

/// The registry host of a reference, Docker's way: the first component if it looks like a host
/// (has a `.` or `:`, or is `localhost`), else Docker Hub.
pub fn registry_host(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first,
        _ => "docker.io",
    }
}

/// Docker Hub's many names.
fn normalize_host(host: &str) -> &str {
    match host {
        "index.docker.io" | "registry-1.docker.io" | "docker.io" => "docker.io",
        other => other,
    }
}

/// A `.dockerconfigjson` (`{"auths": {…}}`) or legacy `.dockercfg` (`{…}`) key, reduced to its
/// host: `https://127.0.0.1:5000/v1/` → `127.0.0.1:5000`.
fn key_host(key: &str) -> &str {
    let k = key.strip_prefix("https://").or_else(|| key.strip_prefix("http://")).unwrap_or(key);
    normalize_host(k.split('/').next().unwrap_or(k))
}

/// Credentials for pulling `image`: the first entry of the first pull secret (in the pod's order)
/// whose registry matches the image's.
pub fn credentials(image: &str, secrets: &[core::Secret]) -> Option<cri::AuthConfig> {
    let host = normalize_host(registry_host(image));
    for secret in secrets {
        let data = secret.data.as_ref();
        let (bytes, nested) = match secret.type_.as_deref() {
            Some("kubernetes.io/dockercfg") => (data.and_then(|d| d.get(".dockercfg")), false),
            _ => (data.and_then(|d| d.get(".dockerconfigjson")), true),
        };
        let Some(bytes) = bytes else { continue };
        let Ok(json) = serde_json::from_slice::<serde_json::Value>(&bytes.0) else { continue };
        let auths = if nested { json.get("auths").cloned().unwrap_or_default() } else { json };
        let Some(map) = auths.as_object() else { continue };
        for (key, entry) in map {
            if key_host(key) != host {
                continue;
            }
            let field = |name: &str| entry.get(name).and_then(|v| v.as_str()).unwrap_or("").to_string();
            return Some(cri::AuthConfig {
                username: field("username"),
                password: field("password"),
                auth: field("auth"),
                server_address: host.to_string(),
                identity_token: field("identitytoken"),
                registry_token: field("registrytoken"),
            });
        }
    }
    None
}

/// An image the runtime holds, as GC sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredImage {
    pub id: String,
    pub handler: String,
    pub size: u64,
    pub pinned: bool,
}

/// Remembers when each `(image, handler)` was last in use, to remove the longest unused first.
#[derive(Debug, Default)]
pub struct UsageRecord {
    last_used: HashMap<(String, String), Timestamp>,
}

impl UsageRecord {
    /// Notes the images present now; those in use (by any container) are marked used `now`.
    /// Images that are gone are forgotten.
    pub fn observe(&mut self, images: &[StoredImage], in_use: &[(String, String)], now: Timestamp) {
        let present: Vec<(String, String)> = images.iter().map(|i| (i.id.clone(), i.handler.clone())).collect();
        self.last_used.retain(|k, _| present.contains(k));
        for key in present {
            let used = in_use.contains(&key);
            let entry = self.last_used.entry(key).or_insert(now);
            if used {
                *entry = now;
            }
        }
    }

    pub fn last_used(&self, id: &str, handler: &str) -> Option<Timestamp> {
        self.last_used.get(&(id.to_string(), handler.to_string())).copied()
    }
}

/// Disk usage of the filesystem holding the images.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsUsage {
    pub capacity: u64,
    pub available: u64,
}

impl FsUsage {
    pub fn used_percent(&self) -> u64 {
        if self.capacity == 0 {
            return 0;
        }
        100 - self.available.saturating_mul(100) / self.capacity
    }
}

/// When image GC runs and how far it goes.
#[derive(Clone, Copy, Debug)]
pub struct Thresholds {
    /// Disk usage in percent above which GC runs, and to which it brings usage down.
    pub high: u8,
    pub low: u8,
    /// An image used more recently than this is kept (kubelet's `--minimum-image-ttl-duration`).
    pub min_age: jiff::SignedDuration,
}

/// The tuples to remove, oldest use first, to bring usage from above `high` percent to `low`:
/// none while usage is at or below `high`; never one in use, pinned, or used within `min_age`.
pub fn to_collect(
    images: &[StoredImage],
    in_use: &[(String, String)],
    record: &UsageRecord,
    fs: FsUsage,
    t: Thresholds,
    now: Timestamp,
) -> Vec<StoredImage> {
    let (high, low, min_age) = (t.high, t.low, t.min_age);
    if fs.used_percent() <= u64::from(high) {
        return Vec::new();
    }
    let target_available = fs.capacity.saturating_mul(100 - u64::from(low.min(100))) / 100;
    let mut to_free = target_available.saturating_sub(fs.available);
    let mut candidates: Vec<(&StoredImage, Timestamp)> = images
        .iter()
        .filter(|i| !i.pinned && !in_use.contains(&(i.id.clone(), i.handler.clone())))
        .filter_map(|i| record.last_used(&i.id, &i.handler).map(|t| (i, t)))
        .filter(|(_, t)| now.duration_since(*t) >= min_age)
        .collect();
    candidates.sort_by_key(|(i, t)| (*t, i.id.clone(), i.handler.clone()));
    let mut out = Vec::new();
    for (image, _) in candidates {
        if to_free == 0 {
            break;
        }
        to_free = to_free.saturating_sub(image.size);
        out.push(image.clone());
    }
    out
}

/// A key for the pull back-off of one image for one handler.
pub fn pull_key(image: &str, handler: &str) -> String {
    format!("{image}|{handler}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A `kubernetes.io/dockerconfigjson` secret holding `config`.
    fn docker_config_secret(name: &str, config: &serde_json::Value) -> core::Secret {
        core::Secret {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            type_: Some("kubernetes.io/dockerconfigjson".into()),
            data: Some(BTreeMap::from([(
                ".dockerconfigjson".to_string(),
                k8s_openapi::ByteString(serde_json::to_vec(config).unwrap_or_default()),
            )])),
            ..Default::default()
        }
    }

    fn with(image: &str, policy: Option<&str>) -> core::Container {
        core::Container {
            name: "c".into(),
            image: Some(image.into()),
            image_pull_policy: policy.map(String::from),
            ..Default::default()
        }
    }

    #[test]
    fn the_pull_policy_defaults_from_the_tag() {
        assert_eq!(pull_policy(&with("busybox", None)), PullPolicy::Always);
        assert_eq!(pull_policy(&with("busybox:latest", None)), PullPolicy::Always);
        assert_eq!(pull_policy(&with("127.0.0.1:5000/busybox", None)), PullPolicy::Always, "a port is not a tag");
        assert_eq!(pull_policy(&with("127.0.0.1:5000/busybox:1.36", None)), PullPolicy::IfNotPresent);
        assert_eq!(pull_policy(&with("busybox@sha256:abc", None)), PullPolicy::IfNotPresent);
        assert_eq!(pull_policy(&with("busybox:1.36", Some("Always"))), PullPolicy::Always);
        assert_eq!(pull_policy(&with("busybox", Some("Never"))), PullPolicy::Never);
    }

    #[test]
    fn registry_hosts_follow_dockers_rules() {
        assert_eq!(registry_host("busybox"), "docker.io");
        assert_eq!(registry_host("library/busybox:1"), "docker.io");
        assert_eq!(registry_host("127.0.0.1:5000/app:1.0"), "127.0.0.1:5000");
        assert_eq!(registry_host("localhost/app"), "localhost");
        assert_eq!(registry_host("ghcr.io/org/app"), "ghcr.io");
    }

    #[test]
    fn pull_secrets_give_credentials_for_the_matching_registry_only() {
        let cfg = serde_json::json!({"auths": {
            "https://127.0.0.1:5000/v1/": {"auth": "dTpw", "username": "u", "password": "p"},
            "https://index.docker.io/v1/": {"auth": "aHViOmh1Yg=="}
        }});
        let secrets = vec![docker_config_secret("regcred", &cfg)];
        let auth = credentials("127.0.0.1:5000/private/app:1.0", &secrets).unwrap();
        assert_eq!((auth.username.as_str(), auth.password.as_str(), auth.auth.as_str()), ("u", "p", "dTpw"));
        assert_eq!(auth.server_address, "127.0.0.1:5000");
        assert_eq!(credentials("busybox", &secrets).unwrap().auth, "aHViOmh1Yg==");
        assert!(credentials("ghcr.io/x/y", &secrets).is_none());
    }

    fn image(id: &str, handler: &str, size: u64) -> StoredImage {
        StoredImage { id: id.into(), handler: handler.into(), size, pinned: false }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    #[test]
    fn image_gc_removes_unused_tuples_oldest_first_until_below_the_low_threshold() {
        let images =
            vec![image("a", "runc", 30), image("a", "gvisor", 30), image("b", "runc", 30), image("c", "runc", 30)];
        let mut record = UsageRecord::default();
        record.observe(&images, &[], at(0));
        record.observe(&images, &[("b".into(), "runc".into())], at(100));
        record.observe(&images, &[("a".into(), "gvisor".into())], at(200));
        let in_use = vec![("c".to_string(), "runc".to_string())];
        // 90 % used of 1000 bytes: to reach 80 %, 100 bytes go.
        let fs = FsUsage { capacity: 1000, available: 100 };
        let t = Thresholds { high: 85, low: 80, min_age: jiff::SignedDuration::from_secs(60) };
        let gone = to_collect(&images, &in_use, &record, fs, t, at(400));
        assert_eq!(gone, vec![image("a", "runc", 30), image("b", "runc", 30), image("a", "gvisor", 30)]);
        let gone = to_collect(&images, &in_use, &record, FsUsage { capacity: 1000, available: 140 }, t, at(400));
        assert_eq!(gone, vec![image("a", "runc", 30), image("b", "runc", 30)], "only enough to get to 80 %");
        assert!(
            to_collect(&images, &in_use, &record, FsUsage { capacity: 1000, available: 150 }, t, at(400)).is_empty()
        );
        let recent = to_collect(&images, &in_use, &record, fs, t, at(230));
        assert_eq!(recent, vec![image("a", "runc", 30), image("b", "runc", 30)], "a/gvisor was used 30 s ago");
    }
}
