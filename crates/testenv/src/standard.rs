//! The standard image set the image issue's acceptance needs, with stable names, and the large
//! multi-layer image for the pull benchmark.

use crate::images::{
    Compression, ContainerConfig, Format, Image, Index, LayerBuilder, Platform, busybox_image, busybox_layer,
    pseudo_random_bytes,
};
use crate::registry::{PushedImage, PushedIndex, Registry};

/// The `os.version`s of the two windows/amd64 entries of `multi:1.0` (Server 2022 and 2019).
pub const WINDOWS_2022: &str = "10.0.20348.1970";
pub const WINDOWS_2019: &str = "10.0.17763.4851";

/// What [`Registry::push_standard_set`] pushed. Every field carries the digests, platforms and
/// diff_ids a client should see.
#[derive(Clone, Debug)]
pub struct StandardSet {
    /// `busybox:latest`: host platform, one gzip busybox layer, `Cmd ["sh"]`, OCI.
    pub busybox: PushedImage,
    /// `library/busybox:latest`: the same image (what `docker.io/library/busybox` mirrors to).
    pub library_busybox: PushedImage,
    /// `multi:1.0`: OCI index with linux/amd64, linux/arm64/v8, windows/amd64 10.0.20348.1970 and
    /// windows/amd64 10.0.17763.4851. Each entry has its own config; all share the busybox layer.
    pub multi: PushedIndex,
    /// `multi:1.0-docker`: the same entries as a Docker manifest list of schema 2 manifests.
    pub multi_docker: PushedIndex,
    /// `zstd:1.0`: one zstd layer (OCI).
    pub zstd: PushedImage,
    /// `plain:1.0`: one uncompressed layer (OCI).
    pub plain: PushedImage,
    /// `whiteout:1.0`: base layer with `/a/keep`, `/a/gone`, `/d/old`; the second layer deletes
    /// `/a/gone` (`a/.wh.gone`), makes `/d` opaque (`d/.wh..wh..opq`) and adds `/d/new`.
    pub whiteout: PushedImage,
    /// `private/app:1.0`: busybox with `Cmd ["sh", "-c", "echo app"]`, meant for auth tests.
    pub private_app: PushedImage,
}

impl StandardSet {
    /// Every single-platform image (index entries not included).
    pub fn images(&self) -> Vec<&PushedImage> {
        vec![&self.busybox, &self.library_busybox, &self.zstd, &self.plain, &self.whiteout, &self.private_app]
    }
}

/// The four platforms of `multi:1.0`.
pub fn multi_platforms() -> Vec<Platform> {
    vec![
        Platform::new("linux", "amd64"),
        Platform::new("linux", "arm64").with_variant("v8"),
        Platform::new("windows", "amd64").with_os_version(WINDOWS_2022),
        Platform::new("windows", "amd64").with_os_version(WINDOWS_2019),
    ]
}

/// The `multi:1.0` index in `format`.
pub fn multi_index(format: Format) -> Index {
    // A label keeps the amd64 entry's config (the image ID) apart from busybox:latest's.
    let mut cfg = ContainerConfig::cmd(&["sh"]);
    cfg.labels.insert("dev.berth.testenv.image".into(), "multi".into());
    let base = Image::build(format, Platform::host(), cfg, vec![busybox_layer(Compression::Gzip)]);
    Index::build(format, multi_platforms().into_iter().map(|p| base.with_platform(p)).collect())
}

/// The two-layer image of `whiteout:1.0`.
pub fn whiteout_image() -> Image {
    let base = LayerBuilder::new()
        .dir("a", 0o755)
        .file("a/keep", "keep\n", 0o644)
        .file("a/gone", "gone\n", 0o644)
        .dir("d", 0o755)
        .file("d/old", "old\n", 0o644)
        .build(Compression::Gzip);
    let top = LayerBuilder::new()
        .dir("a", 0o755)
        .whiteout("a/gone")
        .dir("d", 0o755)
        .opaque("d")
        .file("d/new", "new\n", 0o644)
        .build(Compression::Gzip);
    Image::build(Format::Oci, Platform::host(), ContainerConfig::cmd(&["sh"]), vec![base, top])
}

fn small_image(name: &str, compression: Compression) -> Image {
    let layer = LayerBuilder::new()
        .dir("etc", 0o755)
        .file(&format!("etc/{name}-release"), format!("{name} layer\n"), 0o644)
        .dir_owned("home/app", 0o750, 1000, 1000)
        .file_owned("home/app/data", format!("{name} data\n").repeat(64), 0o640, 1000, 1000)
        .symlink("data", "home/app/data")
        .build(compression);
    Image::build(Format::Oci, Platform::host(), ContainerConfig::cmd(&["sh"]), vec![layer])
}

impl Registry {
    /// Pushes the [`StandardSet`] (a few MB, well under a second on loopback).
    pub async fn push_standard_set(&self) -> StandardSet {
        let busybox = busybox_image(Format::Oci);
        let mut app_cfg = ContainerConfig::cmd(&["sh", "-c", "echo app"]);
        app_cfg.working_dir = Some("/".into());
        let app = Image::build(Format::Oci, Platform::host(), app_cfg, vec![busybox_layer(Compression::Gzip)]);
        StandardSet {
            busybox: self.push_image("busybox", "latest", &busybox).await,
            library_busybox: self.push_image("library/busybox", "latest", &busybox).await,
            multi: self.push_index("multi", "1.0", &multi_index(Format::Oci)).await,
            multi_docker: self.push_index("multi", "1.0-docker", &multi_index(Format::Docker)).await,
            zstd: self.push_image("zstd", "1.0", &small_image("zstd", Compression::Zstd)).await,
            plain: self.push_image("plain", "1.0", &small_image("plain", Compression::None)).await,
            whiteout: self.push_image("whiteout", "1.0", &whiteout_image()).await,
            private_app: self.push_image("private/app", "1.0", &app).await,
        }
    }

    /// Pushes `pause:3.9` ([`crate::images::pause_image`]; compiles `c/pause.c` with `cc`).
    pub async fn push_pause(&self) -> PushedImage {
        let img = tokio::task::spawn_blocking(|| crate::images::pause_image(Format::Oci)).await.expect("build pause");
        self.push_image("pause", "3.9", &img).await
    }

    /// Pushes `big:1.0`: [`big_image`] of `size_mb` MB.
    pub async fn push_big(&self, size_mb: usize) -> PushedImage {
        let img = tokio::task::spawn_blocking(move || big_image(size_mb)).await.expect("build big image");
        self.push_image("big", "1.0", &img).await
    }
}

/// A `size_mb` MB image in 5 gzip layers (fewer when small) of deterministic incompressible data,
/// for pull benchmarks. Each layer is one file `/big/<i>.bin`.
pub fn big_image(size_mb: usize) -> Image {
    big_image_in_layers(size_mb, size_mb.clamp(1, 5))
}

/// [`big_image`] with the layer count chosen.
pub fn big_image_in_layers(size_mb: usize, layers: usize) -> Image {
    let per_layer = size_mb * 1024 * 1024 / layers;
    let layers = (0..layers)
        .map(|i| {
            LayerBuilder::new()
                .dir("big", 0o755)
                .file(&format!("big/{i}.bin"), pseudo_random_bytes(0xB16 + i as u64, per_layer), 0o644)
                .build(Compression::Gzip)
        })
        .collect();
    Image::build(Format::Oci, Platform::host(), ContainerConfig::cmd(&["sh"]), layers)
}
