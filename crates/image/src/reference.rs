//! Image references (`busybox`, `127.0.0.1:5000/app:1.0`, `repo@sha256:…`), parsed and normalized
//! the way Docker and containerd do.
//!
//! Grammar (from the distribution reference specification): `[domain/]path[:tag][@digest]`, where
//! the first `/`-separated component is a domain when it contains `.` or `:` or is `localhost`;
//! path components are lowercase alphanumerics joined by `.`, `_`, `__` or runs of `-`; a tag is
//! `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`; a digest is `sha256:` and 64 lowercase hex digits. Without a
//! domain the image lives on `docker.io`, where one-component paths get a `library/` prefix; without
//! tag or digest the tag is `latest`.

use std::fmt;

use crate::ImageError;

/// The registry that short names resolve to.
pub const DEFAULT_REGISTRY: &str = "docker.io";
const NAME_MAX: usize = 255;

/// A fully normalized image reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// `docker.io`, `127.0.0.1:5000`, `[::1]:5000`.
    pub registry: String,
    /// `library/busybox`.
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:<hex>`.
    pub digest: Option<String>,
}

impl Reference {
    /// Parses and normalizes `s`; a reference with neither tag nor digest gets `latest`.
    pub fn parse(s: &str) -> Result<Self, ImageError> {
        let invalid = |why: &str| ImageError::InvalidArgument(format!("invalid image reference {s:?}: {why}"));
        if s.is_empty() {
            return Err(invalid("empty"));
        }
        if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid("a 64-character hexadecimal string is an image id, not a reference"));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((rest, digest)) => {
                validate_digest(digest).map_err(|why| invalid(&why))?;
                (rest, Some(digest.to_string()))
            }
            None => (s, None),
        };
        // A tag follows the last ':' only if no '/' comes after it (else it is a port).
        let (name, tag) = match rest.rfind(':') {
            Some(i) if !rest[i + 1..].contains('/') => (&rest[..i], Some(&rest[i + 1..])),
            _ => (rest, None),
        };
        if let Some(tag) = tag {
            validate_tag(tag).map_err(|why| invalid(&why))?;
        }
        if name.is_empty() {
            return Err(invalid("empty repository name"));
        }
        let (registry, path) = match name.split_once('/') {
            Some((first, path)) if first.contains(['.', ':']) || first == "localhost" => {
                validate_domain(first).map_err(|why| invalid(&why))?;
                (first.to_string(), path.to_string())
            }
            _ => (DEFAULT_REGISTRY.to_string(), name.to_string()),
        };
        let registry = match registry.as_str() {
            "index.docker.io" | "registry-1.docker.io" => DEFAULT_REGISTRY.to_string(),
            _ => registry,
        };
        if path.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(invalid("repository name must be lowercase"));
        }
        for component in path.split('/') {
            validate_path_component(component).map_err(|why| invalid(&why))?;
        }
        let repository =
            if registry == DEFAULT_REGISTRY && !path.contains('/') { format!("library/{path}") } else { path };
        if registry.len() + 1 + repository.len() > NAME_MAX {
            return Err(invalid("repository name longer than 255 characters"));
        }
        let tag = match (tag, &digest) {
            (Some(tag), _) => Some(tag.to_string()),
            (None, Some(_)) => None,
            (None, None) => Some("latest".to_string()),
        };
        Ok(Reference { registry, repository, tag, digest })
    }

    /// `registry/repository`, e.g. `docker.io/library/busybox`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// `name:tag`, if the reference has a tag.
    pub fn tagged(&self) -> Option<String> {
        self.tag.as_ref().map(|tag| format!("{}:{tag}", self.name()))
    }

    /// `name@digest` for any digest.
    pub fn with_digest(&self, digest: &str) -> String {
        format!("{}@{digest}", self.name())
    }

    /// What to ask the registry's manifests endpoint for: the digest if any, else the tag.
    pub fn manifest_reference(&self) -> &str {
        self.digest.as_deref().or(self.tag.as_deref()).unwrap_or("latest")
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// `sha256:` followed by 64 lowercase hex digits; the only algorithm this store keeps.
pub(crate) fn validate_digest(digest: &str) -> Result<(), String> {
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return Err(format!("digest {digest:?} has no algorithm"));
    };
    if algorithm != "sha256" {
        return Err(format!("digest algorithm {algorithm:?} is not supported (only sha256)"));
    }
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(format!("digest {digest:?} is not 64 lowercase hex digits"));
    }
    Ok(())
}

fn validate_tag(tag: &str) -> Result<(), String> {
    let bytes = tag.as_bytes();
    let ok = !bytes.is_empty()
        && bytes.len() <= 128
        && (bytes[0].is_ascii_alphanumeric() || bytes[0] == b'_')
        && bytes.iter().all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok { Ok(()) } else { Err(format!("invalid tag {tag:?}")) }
}

fn validate_domain(domain: &str) -> Result<(), String> {
    let bad = || Err(format!("invalid registry host {domain:?}"));
    let (host_ok, port) = if let Some(rest) = domain.strip_prefix('[') {
        // [ipv6]:port
        let Some((addr, after)) = rest.split_once(']') else { return bad() };
        let port = match after {
            "" => None,
            _ => match after.strip_prefix(':') {
                Some(port) => Some(port),
                None => return bad(),
            },
        };
        (addr.parse::<std::net::Ipv6Addr>().is_ok(), port)
    } else {
        let (host, port) = match domain.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (domain, None),
        };
        let labels_ok = host.split('.').all(|label| {
            !label.is_empty()
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
        (labels_ok, port)
    };
    if !host_ok || port.is_some_and(|port| port.parse::<u16>().is_err()) {
        return bad();
    }
    Ok(())
}

fn validate_path_component(component: &str) -> Result<(), String> {
    let bad = || Err(format!("invalid repository path component {component:?}"));
    let bytes = component.as_bytes();
    if bytes.is_empty() || !bytes[0].is_ascii_alphanumeric() || !bytes[bytes.len() - 1].is_ascii_alphanumeric() {
        return bad();
    }
    // Separators: one '.', one '_', two '_', or any run of '-'.
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b.is_ascii_lowercase() || b.is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && matches!(bytes[i], b'.' | b'_' | b'-') {
            i += 1;
        }
        let sep = &component[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|b| b == b'-');
        if !ok || i == start {
            return bad();
        }
    }
    Ok(())
}

/// Whether `host` (`name[:port]` or `[v6]:port`) is a loopback address, which Docker reaches over
/// plain HTTP without being told.
pub(crate) fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        host.rsplit_once(':').map(|(h, _)| h).unwrap_or(host)
    };
    if name == "localhost" {
        return true;
    }
    name.parse::<std::net::IpAddr>().map(|ip| ip.is_loopback()).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(s: &str) -> String {
        Reference::parse(s).unwrap().to_string()
    }

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn short_names_resolve_to_docker_hub_library_latest() {
        assert_eq!(parsed("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(parsed("busybox:1.36"), "docker.io/library/busybox:1.36");
        assert_eq!(parsed("user/app"), "docker.io/user/app:latest");
        assert_eq!(parsed("index.docker.io/library/busybox"), "docker.io/library/busybox:latest");
        assert_eq!(parsed("docker.io/busybox"), "docker.io/library/busybox:latest");
    }

    #[test]
    fn registry_hosts_with_ports_are_kept() {
        let r = Reference::parse("127.0.0.1:5000/app:1.0").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("127.0.0.1:5000", "app", Some("1.0"))
        );
        assert_eq!(parsed("localhost/a/b"), "localhost/a/b:latest");
        assert_eq!(parsed("localhost:5000/a"), "localhost:5000/a:latest");
        assert_eq!(parsed("registry.k8s.io/pause:3.10"), "registry.k8s.io/pause:3.10");
        assert_eq!(parsed("[::1]:5000/app"), "[::1]:5000/app:latest");
        assert_eq!(Reference::parse("127.0.0.1:5000/app").unwrap().tag.as_deref(), Some("latest"));
    }

    #[test]
    fn digest_references_have_no_implied_tag() {
        let r = Reference::parse(&format!("repo@{D}")).unwrap();
        assert_eq!(r.tag, None);
        assert_eq!(r.digest.as_deref(), Some(D));
        assert_eq!(r.to_string(), format!("docker.io/library/repo@{D}"));
        assert_eq!(r.manifest_reference(), D);
        let r = Reference::parse(&format!("127.0.0.1:5000/repo:1@{D}")).unwrap();
        assert_eq!(r.tag.as_deref(), Some("1"));
        assert_eq!(r.manifest_reference(), D);
    }

    #[test]
    fn bad_references_are_invalid_arguments_that_say_why() {
        for bad in [
            "",
            "Busybox",
            "busybox:",
            "busybox:-x",
            "busybox@sha256:abc",
            "busybox@md5:0123",
            "a//b",
            "a/-b",
            "a/b_",
            "a/b...c",
            "bad_host:x/app",
            "example.com:99999/app",
            &"a".repeat(64),
            "busybox:tag:tag",
            "a b",
        ] {
            match Reference::parse(bad) {
                Err(ImageError::InvalidArgument(msg)) => assert!(msg.starts_with("invalid image reference"), "{msg}"),
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn loopback_hosts_are_recognized() {
        assert!(is_loopback_host("127.0.0.1:5000"));
        assert!(is_loopback_host("127.3.4.5"));
        assert!(is_loopback_host("localhost:5000"));
        assert!(is_loopback_host("[::1]:5000"));
        assert!(!is_loopback_host("docker.io"));
        assert!(!is_loopback_host("10.0.0.1:5000"));
    }
}
