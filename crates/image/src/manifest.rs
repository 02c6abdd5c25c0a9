//! The wire documents of an image — manifests, indexes, descriptors, the image config — in both
//! Docker v2 schema 2 and OCI spellings, and telling them apart.
//!
//! Our own small serde types rather than oci-spec's: the two spellings share one shape, and a pull
//! must tolerate fields either side leaves out (Docker lists omit `mediaType` on entries, some
//! registries send `application/json`), which strict typed builders reject.

use serde::Deserialize;

use crate::ImageError;
use crate::platform::Platform;

pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1";

/// The Accept header for manifest requests: every kind we can read.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.v2+json";

/// Manifests larger than this are refused (distribution itself caps them at 4 MiB).
pub const MANIFEST_MAX: u64 = 4 << 20;

/// A content descriptor.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default)]
    pub platform: Option<DescriptorPlatform>,
    #[serde(default)]
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// The platform object of an index entry.
#[derive(Debug, Clone, Deserialize)]
pub struct DescriptorPlatform {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default, rename = "os.version")]
    pub os_version: Option<String>,
    #[serde(default, rename = "os.features")]
    pub os_features: Vec<String>,
    #[serde(default)]
    pub variant: Option<String>,
}

impl DescriptorPlatform {
    pub fn to_platform(&self) -> Platform {
        Platform {
            os: self.os.clone(),
            architecture: self.architecture.clone(),
            variant: self.variant.clone(),
            os_version: self.os_version.clone(),
            os_features: self.os_features.clone(),
        }
        .normalized()
    }
}

/// An image manifest (Docker schema 2 or OCI).
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
}

/// A manifest list or OCI image index.
#[derive(Debug, Clone, Deserialize)]
pub struct Index {
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
}

/// A fetched manifest document, by kind.
#[derive(Debug, Clone)]
pub enum Document {
    Manifest(Manifest),
    Index(Index),
}

impl Document {
    /// Decodes `bytes` using the media type the registry sent, falling back to the body's own
    /// `mediaType` and then to its shape.
    pub fn parse(content_type: &str, bytes: &[u8]) -> Result<Self, ImageError> {
        let invalid = |why: String| ImageError::InvalidArgument(format!("unreadable manifest: {why}"));
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
        let declared = value.get("mediaType").and_then(|v| v.as_str()).unwrap_or_default();
        let content_type = content_type.split(';').next().unwrap_or_default().trim();
        let kind = [content_type, declared]
            .into_iter()
            .find(|t| {
                [DOCKER_MANIFEST, DOCKER_LIST, OCI_MANIFEST, OCI_INDEX].contains(t) || t.starts_with(DOCKER_SCHEMA1)
            })
            .map(str::to_string)
            .unwrap_or_else(|| if value.get("manifests").is_some() { OCI_INDEX.into() } else { OCI_MANIFEST.into() });
        if kind.starts_with(DOCKER_SCHEMA1) || value.get("schemaVersion").and_then(|v| v.as_u64()) == Some(1) {
            return Err(invalid("Docker schema 1 manifests are not supported".into()));
        }
        if kind == OCI_INDEX || kind == DOCKER_LIST {
            serde_json::from_value(value).map(Document::Index).map_err(|e| invalid(e.to_string()))
        } else {
            serde_json::from_value(value).map(Document::Manifest).map_err(|e| invalid(e.to_string()))
        }
    }
}

/// The parts of the image config this crate reads; the whole JSON is kept in the record.
#[derive(Debug, Clone, Deserialize)]
pub struct ImageConfig {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub variant: Option<String>,
    #[serde(default, rename = "os.version")]
    pub os_version: Option<String>,
    pub rootfs: RootFs,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RootFs {
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

/// Whether an index entry is an attestation or other non-image artifact (buildx adds
/// `unknown/unknown` entries for provenance), which is never a candidate.
pub fn is_attestation(descriptor: &Descriptor) -> bool {
    descriptor.annotations.contains_key("vnd.docker.reference.type")
        || descriptor.platform.as_ref().is_some_and(|p| p.os == "unknown" || p.architecture == "unknown")
}

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// What the media type claims.
    pub fn from_media_type(media_type: &str) -> Self {
        if media_type.ends_with("+zstd") || media_type.ends_with(".zstd") {
            Compression::Zstd
        } else if media_type.ends_with("+gzip") || media_type.ends_with(".gzip") {
            Compression::Gzip
        } else {
            Compression::None
        }
    }

    /// What the first bytes say; media types sometimes lie.
    pub fn sniff(head: &[u8]) -> Option<Self> {
        if head.starts_with(&[0x1f, 0x8b]) {
            Some(Compression::Gzip)
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Some(Compression::Zstd)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_told_apart_by_header_body_or_shape() {
        let index = br#"{"schemaVersion":2,"manifests":[{"digest":"sha256:00","size":1,"platform":{"os":"linux","architecture":"amd64"}}]}"#;
        assert!(matches!(Document::parse("application/json", index), Ok(Document::Index(_))));
        let manifest = br#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json","config":{"digest":"sha256:00","size":1},"layers":[]}"#;
        assert!(matches!(Document::parse("", manifest), Ok(Document::Manifest(_))));
        assert!(matches!(Document::parse(OCI_MANIFEST, manifest), Ok(Document::Manifest(_))));
        let v1 = br#"{"schemaVersion":1,"name":"x","fsLayers":[]}"#;
        assert!(matches!(
            Document::parse("application/vnd.docker.distribution.manifest.v1+prettyjws", v1),
            Err(ImageError::InvalidArgument(_))
        ));
    }

    #[test]
    fn compression_comes_from_media_type_and_magic_bytes() {
        assert_eq!(Compression::from_media_type("application/vnd.oci.image.layer.v1.tar+gzip"), Compression::Gzip);
        assert_eq!(Compression::from_media_type("application/vnd.oci.image.layer.v1.tar+zstd"), Compression::Zstd);
        assert_eq!(Compression::from_media_type("application/vnd.oci.image.layer.v1.tar"), Compression::None);
        assert_eq!(
            Compression::from_media_type("application/vnd.docker.image.rootfs.diff.tar.gzip"),
            Compression::Gzip
        );
        assert_eq!(Compression::sniff(&[0x1f, 0x8b, 8]), Some(Compression::Gzip));
        assert_eq!(Compression::sniff(&[0x28, 0xb5, 0x2f, 0xfd]), Some(Compression::Zstd));
        assert_eq!(Compression::sniff(b"etc/\0\0"), None);
    }
}
