//! Guest platforms and choosing a manifest from an image index for one.
//!
//! Matching follows containerd's platform matcher for Linux: os and architecture must be equal
//! after normalization (`x86_64` → `amd64`, `aarch64` → `arm64`, ...); variants must be compatible,
//! where a newer CPU variant runs older ones (`arm/v7` accepts v7, then v6, then v5; `arm64/v8`
//! accepts v8 or no variant; `amd64/v3` accepts v3, v2, then plain amd64). On top of that, as
//! KEP-4216 describes for Windows guests in utility VMs, a handler may name an `os_version`: an
//! entry with exactly that version is preferred, an entry of the same `major.minor.build` (any
//! revision) is compatible, an entry with another build is rejected, and an entry without
//! `os.version` is accepted last. An entry's `os.features` must all be among the handler's.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use crate::ImageError;

/// An OCI platform: os/architecture[/variant], with optional os.version and os.features.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os_version: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub os_features: Vec<String>,
}

impl Default for Platform {
    /// The host's platform.
    fn default() -> Self {
        Platform::host()
    }
}

impl Platform {
    /// `os`/`architecture` with no variant, version or features.
    pub fn new(os: &str, architecture: &str) -> Self {
        Platform {
            os: os.to_string(),
            architecture: architecture.to_string(),
            variant: None,
            os_version: None,
            os_features: Vec::new(),
        }
    }

    /// The platform this process runs on, in OCI names (`linux/amd64`, `linux/arm64/v8`, ...).
    pub fn host() -> Self {
        let os = match std::env::consts::OS {
            "macos" => "darwin",
            other => other,
        };
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "x86" => "386",
            "aarch64" => "arm64",
            "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
            "powerpc64" => "ppc64",
            "loongarch64" => "loong64",
            "mips64" if cfg!(target_endian = "little") => "mips64le",
            other => other,
        };
        Platform::new(os, arch).normalized()
    }

    /// Parses `os/arch[/variant]` (or just `os`, or just `arch`, completed from the host).
    pub fn parse(s: &str) -> Result<Self, ImageError> {
        let invalid = || ImageError::InvalidArgument(format!("invalid platform {s:?}: expected os/arch[/variant]"));
        let parts: Vec<&str> = s.split('/').collect();
        if parts.iter().any(|p| p.is_empty() || p.contains(char::is_whitespace)) {
            return Err(invalid());
        }
        let host = Platform::host();
        let platform = match parts.as_slice() {
            [one] => {
                let one = one.to_ascii_lowercase();
                if is_known_os(&one) { Platform { os: one, ..host } } else { Platform::new(&host.os, &one) }
            }
            [os, arch] => Platform::new(&os.to_ascii_lowercase(), &arch.to_ascii_lowercase()),
            [os, arch, variant] => Platform {
                variant: Some(variant.to_ascii_lowercase()),
                ..Platform::new(&os.to_ascii_lowercase(), &arch.to_ascii_lowercase())
            },
            _ => return Err(invalid()),
        };
        Ok(platform.normalized())
    }

    /// This platform with os, architecture and variant in their canonical OCI spelling.
    pub fn normalized(&self) -> Self {
        let os = match self.os.to_ascii_lowercase().as_str() {
            "macos" => "darwin".to_string(),
            other => other.to_string(),
        };
        let variant = self.variant.as_deref().map(str::to_ascii_lowercase).filter(|v| !v.is_empty());
        let (architecture, variant) = match self.architecture.to_ascii_lowercase().as_str() {
            "i386" | "386" => ("386".to_string(), None),
            "x86_64" | "x86-64" | "amd64" => {
                let variant = match variant.as_deref() {
                    None | Some("v1") | Some("1") => None,
                    Some(v) => Some(with_v(v)),
                };
                ("amd64".to_string(), variant)
            }
            "aarch64" | "arm64" => {
                let variant = match variant.as_deref() {
                    None | Some("8") | Some("v8") | Some("v8.0") => "v8".to_string(),
                    Some(v) => with_v(v),
                };
                ("arm64".to_string(), Some(variant))
            }
            "armhf" => ("arm".to_string(), Some("v7".to_string())),
            "armel" => ("arm".to_string(), Some("v6".to_string())),
            "arm" => ("arm".to_string(), Some(variant.map(|v| with_v(&v)).unwrap_or_else(|| "v7".to_string()))),
            other => (other.to_string(), variant),
        };
        let os_version = self.os_version.clone().filter(|v| !v.is_empty());
        Platform { os, architecture, variant, os_version, os_features: self.os_features.clone() }
    }

    /// Whether an image for `candidate` can run on this (guest) platform.
    pub fn matches(&self, candidate: &Platform) -> bool {
        self.rank(candidate).is_some()
    }

    /// Index of the best candidate for this platform, or `None`; ties go to the earlier entry.
    pub fn select<'a>(&self, candidates: impl IntoIterator<Item = &'a Platform>) -> Option<usize> {
        let mut best: Option<(usize, Rank)> = None;
        for (i, candidate) in candidates.into_iter().enumerate() {
            if let Some(rank) = self.rank(candidate)
                && best.as_ref().is_none_or(|(_, b)| rank.cmp(b) == Ordering::Less)
            {
                best = Some((i, rank));
            }
        }
        best.map(|(i, _)| i)
    }

    /// How well `candidate` fits (lower is better), or `None` if it does not run here.
    fn rank(&self, candidate: &Platform) -> Option<Rank> {
        let want = self.normalized();
        let have = candidate.normalized();
        if want.os != have.os || want.architecture != have.architecture {
            return None;
        }
        let variant = variant_rank(&want.architecture, want.variant.as_deref(), have.variant.as_deref())?;
        let (version, revision) = match (&want.os_version, &have.os_version) {
            (None, _) => (0, 0),
            (Some(w), Some(h)) if w == h => (0, 0),
            (Some(w), Some(h)) if build_prefix(w) == build_prefix(h) => (1, u64::MAX - revision_of(h)),
            (Some(_), Some(_)) => return None,
            (Some(_), None) => (2, 0),
        };
        if !have.os_features.iter().all(|f| want.os_features.contains(f)) {
            return None;
        }
        Some(Rank { version, variant, revision })
    }
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Rank {
    version: u8,
    variant: u32,
    revision: u64,
}

/// Distance from the wanted variant to the candidate's, if the candidate runs on the wanted one.
fn variant_rank(arch: &str, want: Option<&str>, have: Option<&str>) -> Option<u32> {
    match arch {
        // Normalized arm always carries a variant (v7 by default).
        "arm" => {
            let w = version_number(want?)?;
            let h = version_number(have?)?;
            (h.0 <= w.0 && h.0 >= 5).then(|| (w.0 - h.0) * 100)
        }
        // Normalized arm64 always carries one (v8 by default); v8.x and v9.x run older ones.
        "arm64" => {
            let w = version_number(want?)?;
            let h = version_number(have?)?;
            (h <= w).then(|| (w.0 - h.0) * 100 + w.1.saturating_sub(h.1))
        }
        // Plain amd64 is v1; v3 runs v3, v2 and v1.
        "amd64" => {
            let w = want.map_or(Some((1, 0)), version_number)?;
            let h = have.map_or(Some((1, 0)), version_number)?;
            (h.0 <= w.0).then(|| w.0 - h.0)
        }
        _ => (want == have).then_some(0),
    }
}

/// `v7` → (7, 0), `v8.2` → (8, 2).
fn version_number(variant: &str) -> Option<(u32, u32)> {
    let digits = variant.strip_prefix('v')?;
    let (major, minor) = digits.split_once('.').unwrap_or((digits, "0"));
    Some((major.parse().ok()?, minor.parse().ok()?))
}

fn with_v(v: &str) -> String {
    if v.starts_with('v') { v.to_string() } else { format!("v{v}") }
}

/// `10.0.20348.1970` → `10.0.20348`.
fn build_prefix(version: &str) -> String {
    version.split('.').take(3).collect::<Vec<_>>().join(".")
}

fn revision_of(version: &str) -> u64 {
    version.split('.').nth(3).and_then(|r| r.parse().ok()).unwrap_or(0)
}

fn is_known_os(s: &str) -> bool {
    matches!(
        s,
        "linux" | "windows" | "darwin" | "freebsd" | "netbsd" | "openbsd" | "solaris" | "illumos" | "aix" | "android"
    )
}

impl fmt::Display for Platform {
    /// `os/arch[/variant][ os_version]`, e.g. `linux/arm64/v8` or `windows/amd64 10.0.20348.1970`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(variant) = &self.variant {
            write!(f, "/{variant}")?;
        }
        if let Some(version) = &self.os_version {
            write!(f, " {version}")?;
        }
        Ok(())
    }
}

impl FromStr for Platform {
    type Err = ImageError;
    fn from_str(s: &str) -> Result<Self, ImageError> {
        Platform::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Platform {
        Platform::parse(s).unwrap()
    }

    fn with_version(s: &str, version: &str) -> Platform {
        Platform { os_version: Some(version.to_string()), ..p(s) }
    }

    #[test]
    fn host_platform_uses_oci_names() {
        let host = Platform::host();
        assert_eq!(host.os, "linux");
        #[cfg(target_arch = "x86_64")]
        assert_eq!(host.to_string(), "linux/amd64");
        #[cfg(target_arch = "aarch64")]
        assert_eq!(host.to_string(), "linux/arm64/v8");
    }

    #[test]
    fn parsing_normalizes_architecture_names_and_default_variants() {
        assert_eq!(p("linux/x86_64").to_string(), "linux/amd64");
        assert_eq!(p("linux/aarch64").to_string(), "linux/arm64/v8");
        assert_eq!(p("linux/arm64").to_string(), "linux/arm64/v8");
        assert_eq!(p("Linux/ARM64/8").to_string(), "linux/arm64/v8");
        assert_eq!(p("linux/arm").to_string(), "linux/arm/v7");
        assert_eq!(p("linux/armhf").to_string(), "linux/arm/v7");
        assert_eq!(p("linux/arm/6").to_string(), "linux/arm/v6");
        assert_eq!(p("linux/i386").to_string(), "linux/386");
        assert_eq!(p("windows/amd64").to_string(), "windows/amd64");
        assert_eq!(p("windows").architecture, Platform::host().architecture);
        assert_eq!(p("s390x").os, Platform::host().os);
        for bad in ["", "linux/", "/amd64", "a/b/c/d", "linux/amd 64"] {
            assert!(matches!(Platform::parse(bad), Err(ImageError::InvalidArgument(_))), "{bad:?}");
        }
    }

    #[test]
    fn os_and_architecture_must_match() {
        assert!(p("linux/amd64").matches(&Platform::new("linux", "x86_64")));
        assert!(!p("linux/amd64").matches(&p("linux/arm64")));
        assert!(!p("linux/amd64").matches(&p("windows/amd64")));
        assert!(!p("linux/amd64").matches(&p("linux/386")));
    }

    #[test]
    fn arm64_v8_accepts_v8_or_no_variant() {
        let want = p("linux/arm64");
        assert!(want.matches(&Platform::new("linux", "arm64")));
        assert!(want.matches(&p("linux/arm64/v8")));
        assert!(!want.matches(&p("linux/arm64/v9")));
        assert!(p("linux/arm64/v9").matches(&p("linux/arm64/v8")));
    }

    #[test]
    fn armv7_prefers_v7_then_v6_then_v5() {
        let want = p("linux/arm/v7");
        let v5 = p("linux/arm/v5");
        let v6 = p("linux/arm/v6");
        let v7 = p("linux/arm/v7");
        let v8 = p("linux/arm/v8");
        assert_eq!(want.select([&v5, &v6, &v7]), Some(2));
        assert_eq!(want.select([&v5, &v6]), Some(1));
        assert_eq!(want.select([&v5]), Some(0));
        assert_eq!(want.select([&v8]), None);
        assert_eq!(p("linux/arm/v6").select([&v7, &v5]), Some(1));
    }

    #[test]
    fn amd64_variants_run_older_ones() {
        let want = p("linux/amd64/v3");
        assert_eq!(want.select([&p("linux/amd64"), &p("linux/amd64/v2"), &p("linux/amd64/v4")]), Some(1));
        assert!(!p("linux/amd64").matches(&p("linux/amd64/v2")));
    }

    #[test]
    fn seed_index_picks_the_right_entry_per_handler() {
        let index = seed_index();
        assert_eq!(p("linux/amd64").select(&index), Some(0));
        assert_eq!(p("linux/arm64").select(&index), Some(3));
        assert_eq!(p("linux/arm/v7").select(&index), Some(2));
        assert_eq!(p("linux/arm/v6").select(&index), Some(1));
        assert_eq!(with_version("windows/amd64", "10.0.20348").select(&index), Some(7));
        assert_eq!(with_version("windows/amd64", "10.0.17763").select(&index), Some(8));
        assert_eq!(with_version("windows/amd64", "10.0.17763.4851").select(&index), Some(8));
        assert_eq!(with_version("windows/amd64", "10.0.19041").select(&index), None);
        assert_eq!(p("windows/amd64").select(&index), Some(7));
    }

    #[test]
    fn exact_os_version_is_preferred_over_a_compatible_one() {
        let old = with_version("windows/amd64", "10.0.20348.1000");
        let new = with_version("windows/amd64", "10.0.20348.1970");
        let unversioned = p("windows/amd64");
        let other_build = with_version("windows/amd64", "10.0.17763.4851");
        let want = with_version("windows/amd64", "10.0.20348.1000");
        assert_eq!(want.select([&new, &old]), Some(1));
        // A build prefix matches any revision, the newest preferred.
        let want = with_version("windows/amd64", "10.0.20348");
        assert_eq!(want.select([&old, &new]), Some(1));
        // Entries without os.version come after versioned compatible ones; other builds never.
        assert_eq!(want.select([&unversioned, &old]), Some(1));
        assert_eq!(want.select([&other_build, &unversioned]), Some(1));
        assert_eq!(want.select([&other_build]), None);
    }

    #[test]
    fn entry_os_features_must_be_offered_by_the_handler() {
        let entry = Platform { os_features: vec!["win32k".into()], ..p("windows/amd64") };
        assert!(!p("windows/amd64").matches(&entry));
        let want = Platform { os_features: vec!["win32k".into()], ..p("windows/amd64") };
        assert!(want.matches(&entry));
        assert!(want.matches(&p("windows/amd64")));
    }

    #[test]
    fn display_lists_versions_after_the_platform() {
        let listed: Vec<String> = seed_index().iter().map(|p| p.normalized().to_string()).collect();
        assert_eq!(listed[3], "linux/arm64/v8");
        assert_eq!(listed[7], "windows/amd64 10.0.20348.1970");
    }

    fn seed_index() -> Vec<Platform> {
        vec![
            Platform::new("linux", "amd64"),
            Platform { variant: Some("v5".into()), ..Platform::new("linux", "arm") },
            Platform { variant: Some("v7".into()), ..Platform::new("linux", "arm") },
            Platform { variant: Some("v8".into()), ..Platform::new("linux", "arm64") },
            Platform::new("linux", "386"),
            Platform::new("linux", "ppc64le"),
            Platform::new("linux", "s390x"),
            with_version("windows/amd64", "10.0.20348.1970"),
            with_version("windows/amd64", "10.0.17763.4851"),
        ]
    }
}
