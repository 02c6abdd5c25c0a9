//! Pulls against a real registry (Debian's `docker-registry` on loopback, from berth-testenv):
//! single images, a multi-platform index for two handlers, auth, mirrors, TLS, and every failure
//! the image issue lists. Needs root (whiteouts are device nodes) and the testenv packages.

use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt as _;
use std::path::Path;
use std::sync::Arc;

use berth_image::{Credentials, ImageError, Images, ImagesConfig, Platform, Progress, RegistryHost};
use berth_testenv::standard::{WINDOWS_2019, WINDOWS_2022};
use berth_testenv::{Registry, StandardSet};

struct Env {
    registry: Registry,
    set: StandardSet,
}

async fn env() -> Env {
    let registry = Registry::start();
    let set = registry.push_standard_set().await;
    Env { registry, set }
}

fn platform(s: &str) -> Platform {
    Platform::parse(s).unwrap()
}

fn config(root: &Path, handlers: &[(&str, Platform)]) -> ImagesConfig {
    ImagesConfig {
        root: root.to_path_buf(),
        handlers: handlers.iter().map(|(n, p)| (n.to_string(), p.clone())).collect(),
        default_handler: handlers[0].0.to_string(),
        registries: BTreeMap::new(),
    }
}

fn open(root: &Path) -> Images {
    Images::open(config(
        root,
        &[
            ("runc", platform("linux/amd64")),
            ("arm", platform("linux/arm64")),
            ("win2019", Platform { os_version: Some("10.0.17763".into()), ..platform("windows/amd64") }),
            ("win2022", Platform { os_version: Some(WINDOWS_2022.into()), ..platform("windows/amd64") }),
            ("s390x", platform("linux/s390x")),
        ],
    ))
    .unwrap()
}

fn files_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

fn blob_count(root: &Path) -> usize {
    files_in(&root.join("blobs/sha256")).len()
}

#[tokio::test]
async fn single_image_is_pulled_verified_unpacked_and_found_every_way() {
    let env = env().await;
    let dir = tempfile::tempdir().unwrap();
    let images = open(dir.path());
    let busybox = &env.set.busybox;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let record = images.pull(&busybox.reference, "", None, Some(tx)).await.unwrap();
    assert_eq!(record.id, busybox.image.config_digest);
    assert_eq!(record.handler, "runc");
    assert_eq!(record.repo_tags, vec![format!("{}:latest", env.registry.reference("busybox"))]);
    assert_eq!(record.repo_digests, vec![busybox.reference_by_digest()]);
    assert_eq!(record.manifest_digest, busybox.digest());
    assert_eq!(record.diff_ids, busybox.image.diff_ids());
    assert_eq!(record.config["config"]["Cmd"], serde_json::json!(["sh"]));
    let dirs = images.layer_dirs(&record).unwrap();
    assert_eq!(dirs.len(), 1);
    assert!(dirs[0].join("bin/busybox").is_file() || dirs[0].join("bin").exists());

    let mut events = Vec::new();
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    assert!(matches!(events.first(), Some(Progress::Resolved { .. })), "{events:?}");
    assert!(matches!(events.last(), Some(Progress::Done { id }) if *id == record.id));

    for name in [
        busybox.reference.clone(),
        busybox.reference_by_digest(),
        record.id.clone(),
        record.id["sha256:".len().."sha256:".len() + 12].to_string(),
    ] {
        assert_eq!(images.status(&name, "runc").unwrap().map(|r| r.id), Some(record.id.clone()), "{name}");
    }
    assert_eq!(images.status(&busybox.reference, "arm").unwrap(), None);
    assert_eq!(images.list(None).unwrap().len(), 1);

    // Pulling again is quick and changes nothing.
    let again = images.pull(&busybox.reference, "runc", None, None).await.unwrap();
    assert_eq!(again, record);
    let usage = images.fs_usage().unwrap();
    assert!(usage.used_bytes > busybox.image.layers_size() && usage.inodes_used > 5, "{usage:?}");

    // Reopened, the store still has it.
    drop(images);
    let images = open(dir.path());
    assert_eq!(images.status(&busybox.reference, "").unwrap(), Some(record));
}

#[tokio::test]
async fn index_for_two_handlers_gives_two_images_sharing_layer_blobs() {
    let env = env().await;
    let dir = tempfile::tempdir().unwrap();
    let images = open(dir.path());
    let multi = &env.set.multi;
    let amd = images.pull(&multi.reference, "runc", None, None).await.unwrap();
    let arm = images.pull(&multi.reference, "arm", None, None).await.unwrap();
    let amd_image = multi.index.image_for(&berth_testenv::images::Platform::parse("linux/amd64")).unwrap();
    let arm_image = multi.index.image_for(&berth_testenv::images::Platform::parse("linux/arm64/v8")).unwrap();
    assert_eq!(amd.id, amd_image.config_digest);
    assert_eq!(arm.id, arm_image.config_digest);
    assert_ne!(amd.id, arm.id);
    assert_eq!(amd.manifest_digest, amd_image.manifest_digest);
    assert_eq!(arm.manifest_digest, arm_image.manifest_digest);
    assert_eq!(arm.platform.to_string(), "linux/arm64/v8");
    assert_eq!(amd.repo_digests, vec![format!("{}/multi@{}", env.registry.host(), multi.digest())]);

    let listed: Vec<(String, String)> = images.list(None).unwrap().into_iter().map(|r| (r.handler, r.id)).collect();
    assert_eq!(listed.len(), 2);
    assert!(listed.contains(&("runc".into(), amd.id.clone())) && listed.contains(&("arm".into(), arm.id.clone())));
    assert_eq!(images.list(Some("arm")).unwrap().len(), 1);
    assert_eq!(images.list(Some("")).unwrap()[0].id, amd.id);
    // index + 2 manifests + 2 configs + 1 shared layer blob.
    assert_eq!(blob_count(dir.path()), 6);
    assert_eq!(images.layer_dirs(&amd).unwrap(), images.layer_dirs(&arm).unwrap());

    images.remove(&multi.reference, "arm").unwrap();
    assert_eq!(images.status(&multi.reference, "arm").unwrap(), None);
    let still = images.status(&multi.reference, "runc").unwrap().unwrap();
    assert_eq!(still, amd);
    for dir in images.layer_dirs(&still).unwrap() {
        assert!(dir.is_dir());
    }
    assert_eq!(blob_count(dir.path()), 4);
    assert!(!dir.path().join("blobs/sha256").join(&arm.manifest_digest[7..]).exists());
    // Removing twice is fine; removing the last copy frees everything.
    images.remove(&multi.reference, "arm").unwrap();
    images.remove(&amd.id, "runc").unwrap();
    assert_eq!(blob_count(dir.path()), 0);
    assert!(files_in(&dir.path().join("layers")).is_empty());
}

#[tokio::test]
async fn os_version_picks_the_exact_or_compatible_windows_entry() {
    let env = env().await;
    let dir = tempfile::tempdir().unwrap();
    let images = open(dir.path());
    for reference in [&env.set.multi.reference, &env.set.multi_docker.reference] {
        let old = images.pull(reference, "win2019", None, None).await.unwrap();
        assert_eq!(old.platform.os_version.as_deref(), Some(WINDOWS_2019));
        let new = images.pull(reference, "win2022", None, None).await.unwrap();
        assert_eq!(new.platform.os_version.as_deref(), Some(WINDOWS_2022));
        assert_ne!(old.id, new.id);
    }
}

#[tokio::test]
async fn platform_without_an_entry_is_refused_with_what_the_index_offers() {
    let env = env().await;
    let dir = tempfile::tempdir().unwrap();
    let images = open(dir.path());
    match images.pull(&env.set.multi.reference, "s390x", None, None).await {
        Err(ImageError::NoMatchingPlatform { wanted, offered, .. }) => {
            assert_eq!(wanted, "linux/s390x");
            assert_eq!(
                offered,
                format!("linux/amd64, linux/arm64/v8, windows/amd64 {WINDOWS_2022}, windows/amd64 {WINDOWS_2019}")
            );
        }
        other => panic!("{other:?}"),
    }
    // A single-platform image for another platform is refused as well.
    assert!(matches!(
        images.pull(&env.set.busybox.reference, "s390x", None, None).await,
        Err(ImageError::NoMatchingPlatform { .. })
    ));
    assert!(images.list(None).unwrap().is_empty());
}

#[tokio::test]
async fn gzip_zstd_plain_and_whiteout_layers_unpack_for_overlayfs() {
    let env = env().await;
    let dir = tempfile::tempdir().unwrap();
    let images = open(dir.path());
    for pushed in [&env.set.zstd, &env.set.plain] {
        let record = images.pull(&pushed.reference, "", None, None).await.unwrap();
        let layer = &images.layer_dirs(&record).unwrap()[0];
        let data = std::fs::metadata(layer.join("home/app/data")).unwrap();
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&data), 1000);
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&data.permissions()) & 0o777, 0o640);
        assert_eq!(std::fs::read_link(layer.join("data")).unwrap(), Path::new("home/app/data"));
    }
    let record = images.pull(&env.set.whiteout.reference, "", None, None).await.unwrap();
    let layers = images.layer_dirs(&record).unwrap();
    assert!(layers[0].join("a/gone").is_file());
    assert!(std::fs::symlink_metadata(layers[1].join("a/gone")).unwrap().file_type().is_char_device());
    assert_eq!(xattr::get(layers[1].join("d"), "trusted.overlay.opaque").unwrap(), Some(b"y".to_vec()));
    assert!(layers[1].join("d/new").is_file());
}

#[tokio::test]
async fn token_protected_repository_needs_the_right_credentials() {
    let registry = Registry::start_token_auth("alice", "wonderland");
    let set = registry.push_standard_set().await;
    let dir = tempfile::tempdir().unwrap();
    let images = open(dir.path());
    let app = &set.private_app.reference;
    let wrong = Credentials { username: "alice".into(), password: "nope".into(), ..Default::default() };
    for credentials in [None, Some(wrong)] {
        match images.pull(app, "", credentials, None).await {
            Err(ImageError::Unauthorized { registry: r, repository, .. }) => {
                assert_eq!((r.as_str(), repository.as_str()), (registry.host(), "private/app"));
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(images.list(None).unwrap().is_empty());
    let right = Credentials { username: "alice".into(), password: "wonderland".into(), ..Default::default() };
    let record = images.pull(app, "", Some(right), None).await.unwrap();
    assert_eq!(record.id, set.private_app.image.config_digest);
    // The `auth` field of CRI's AuthConfig works too.
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode("alice:wonderland");
    let other = tempfile::tempdir().unwrap();
    let images = open(other.path());
    images.pull(app, "", Some(Credentials { auth, ..Default::default() }), None).await.unwrap();
}

#[tokio::test]
async fn basic_auth_registry_takes_username_and_password() {
    let registry = Registry::start_basic_auth("bob", "builder");
    let set = registry.push_standard_set().await;
    let dir = tempfile::tempdir().unwrap();
    let images = open(dir.path());
    let bad = Credentials { username: "bob".into(), password: "x".into(), ..Default::default() };
    assert!(matches!(
        images.pull(&set.busybox.reference, "", Some(bad), None).await,
        Err(ImageError::Unauthorized { .. })
    ));
    assert!(matches!(images.pull(&set.busybox.reference, "", None, None).await, Err(ImageError::Unauthorized { .. })));
    let good = Credentials { username: "bob".into(), password: "builder".into(), ..Default::default() };
    images.pull(&set.busybox.reference, "", Some(good), None).await.unwrap();
}

#[tokio::test]
async fn unreachable_registry_is_unavailable_and_missing_tag_is_invalid() {
    let mut env = env().await;
    let dir = tempfile::tempdir().unwrap();
    let images = open(dir.path());
    let missing = env.registry.reference("busybox:no-such-tag");
    match images.pull(&missing, "", None, None).await {
        Err(ImageError::InvalidArgument(msg)) => assert!(msg.contains("not found"), "{msg}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        images.pull(&env.registry.reference("nothing/here:1"), "", None, None).await,
        Err(ImageError::InvalidArgument(_))
    ));
    env.registry.stop();
    // A fresh store, so no scheme or token is cached.
    let other = tempfile::tempdir().unwrap();
    let images = open(other.path());
    match images.pull(&env.set.busybox.reference, "", None, None).await {
        Err(ImageError::RegistryUnavailable { registry, .. }) => assert_eq!(registry, env.registry.host()),
        other => panic!("{other:?}"),
    }
    assert!(images.list(None).unwrap().is_empty());
}

#[tokio::test]
async fn unknown_handler_is_rejected_naming_the_configured_ones() {
    let dir = tempfile::tempdir().unwrap();
    let images = open(dir.path());
    match images.pull("busybox", "foo", None, None).await {
        Err(ImageError::InvalidArgument(msg)) => assert_eq!(
            msg,
            "runtime handler \"foo\" is not configured; configured handlers: arm, runc, s390x, win2019, win2022"
        ),
        other => panic!("{other:?}"),
    }
    assert!(matches!(images.status("busybox", "foo"), Err(ImageError::InvalidArgument(_))));
    assert!(matches!(images.remove("busybox", "foo"), Err(ImageError::InvalidArgument(_))));
    assert_eq!(images.resolve_handler("").unwrap(), "runc");
}

#[tokio::test]
async fn corrupt_blob_is_rejected_and_the_store_stays_clean() {
    let env = env().await;
    let dir = tempfile::tempdir().unwrap();
    let images = open(dir.path());
    let zstd = &env.set.zstd;
    let layer = &zstd.image.layers[0].digest;
    let original = std::fs::read(env.registry.blob_path(layer)).unwrap();
    let mut corrupt = original.clone();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    std::fs::write(env.registry.blob_path(layer), &corrupt).unwrap();
    match images.pull(&zstd.reference, "", None, None).await {
        Err(ImageError::DigestMismatch { digest, .. }) => assert_eq!(&digest, layer),
        other => panic!("{other:?}"),
    }
    assert!(images.list(None).unwrap().is_empty());
    assert!(!dir.path().join("blobs/sha256").join(&layer[7..]).exists());
    assert!(files_in(&dir.path().join("ingest")).is_empty());
    assert!(files_in(&dir.path().join("layers")).is_empty());
    // Truncated is rejected as well.
    std::fs::write(env.registry.blob_path(layer), &original[..original.len() / 2]).unwrap();
    assert!(images.pull(&zstd.reference, "", None, None).await.is_err());
    assert!(!dir.path().join("blobs/sha256").join(&layer[7..]).exists());
    // Once the registry is fixed, the pull works.
    std::fs::write(env.registry.blob_path(layer), &original).unwrap();
    images.pull(&zstd.reference, "", None, None).await.unwrap();
}

#[tokio::test]
async fn docker_hub_names_come_from_a_configured_mirror() {
    let env = env().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), &[("runc", platform("linux/amd64"))]);
    cfg.registries
        .insert("docker.io".into(), RegistryHost { mirrors: vec![env.registry.base_url()], ..Default::default() });
    let images = Images::open(cfg).unwrap();
    let record = images.pull("busybox", "", None, None).await.unwrap();
    assert_eq!(record.id, env.set.library_busybox.image.config_digest);
    assert_eq!(record.repo_tags, vec!["docker.io/library/busybox:latest"]);
    assert!(images.status("busybox:latest", "runc").unwrap().is_some());
}

#[tokio::test]
async fn tls_registry_is_trusted_through_its_ca_file() {
    let registry = Registry::start_tls();
    let set = registry.push_standard_set().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, registry.ca_pem().unwrap()).unwrap();
    let mut cfg = config(&dir.path().join("store"), &[("runc", platform("linux/amd64"))]);
    cfg.registries.insert(registry.host().into(), RegistryHost { ca_files: vec![ca], ..Default::default() });
    let images = Images::open(cfg).unwrap();
    images.pull(&set.busybox.reference, "", None, None).await.unwrap();
}

#[tokio::test]
async fn concurrent_pulls_of_one_image_share_the_download() {
    let env = env().await;
    let dir = tempfile::tempdir().unwrap();
    let images = open(dir.path());
    let reference = &env.set.busybox.reference;
    let (a, b, c) = tokio::join!(
        images.pull(reference, "runc", None, None),
        images.pull(reference, "runc", None, None),
        images.pull(reference, "", None, None),
    );
    assert_eq!(a.unwrap(), b.unwrap());
    c.unwrap();
    let layer = &env.set.busybox.image.layers[0].digest;
    let log = env.registry.log();
    let fetches = log.lines().filter(|l| l.contains(&format!("/blobs/{layer}")) && l.contains("GET")).count();
    assert_eq!(fetches, 1, "layer fetched {fetches} times:\n{log}");
}

#[tokio::test]
async fn repulling_a_tag_that_moved_moves_it_in_the_store() {
    let env = env().await;
    let dir = tempfile::tempdir().unwrap();
    let images = open(dir.path());
    let tag = env.registry.reference("moving:1");
    env.registry.push_image("moving", "1", &env.set.zstd.image).await;
    let first = images.pull(&tag, "", None, None).await.unwrap();
    env.registry.push_image("moving", "1", &env.set.plain.image).await;
    let second = images.pull(&tag, "", None, None).await.unwrap();
    assert_ne!(first.id, second.id);
    let old = images.status(&first.id, "").unwrap().unwrap();
    assert!(old.repo_tags.is_empty());
    assert_eq!(images.status(&tag, "").unwrap().unwrap().id, second.id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pull_interrupted_mid_download_completes_after_reopening() {
    let registry = Registry::start();
    let big = registry.push_big(40).await;
    let dir = tempfile::tempdir().unwrap();
    let images = Arc::new(open(dir.path()));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let task = {
        let images = images.clone();
        let reference = big.reference.clone();
        tokio::spawn(async move { images.pull(&reference, "", None, Some(tx)).await })
    };
    // Kill it once some layer is part-way down.
    loop {
        match rx.recv().await {
            Some(Progress::Downloading { done, total, .. }) if done > 1 << 20 && done < total => break,
            Some(_) => {}
            None => panic!("pull ended before it could be interrupted: {:?}", task.await),
        }
    }
    task.abort();
    let _ = task.await;
    assert!(images.list(None).unwrap().is_empty());
    drop(images);
    assert!(!files_in(&dir.path().join("ingest")).is_empty(), "a partial download is kept to resume");

    let images = open(dir.path());
    assert!(images.list(None).unwrap().is_empty());
    assert!(files_in(&dir.path().join("layers")).iter().all(|n| !n.starts_with(".tmp-")));
    let record = images.pull(&big.reference, "", None, None).await.unwrap();
    assert_eq!(record.id, big.image.config_digest);
    assert_eq!(images.layer_dirs(&record).unwrap().len(), big.image.layers.len());
    assert!(files_in(&dir.path().join("ingest")).is_empty());
}

/// Mounts a small tmpfs for the duration of a test (root only).
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(dir: &Path, size: &str) -> Option<SmallDisk> {
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .ok()?;
        status.success().then(|| SmallDisk(dir.to_path_buf()))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[tokio::test]
async fn full_disk_fails_the_pull_cleanly_and_frees_what_it_wrote() {
    let registry = Registry::start();
    let big = registry.push_big(24).await;
    let set = registry.push_standard_set().await;
    let dir = tempfile::tempdir().unwrap();
    let _disk = SmallDisk::mount(dir.path(), "12m").expect("mounting a 12 MB tmpfs (the tests run as root)");
    let images = open(dir.path());
    match images.pull(&big.reference, "", None, None).await {
        Err(ImageError::NoSpace { what }) => assert!(!what.is_empty()),
        other => panic!("{other:?}"),
    }
    assert!(images.list(None).unwrap().is_empty());
    assert!(files_in(&dir.path().join("ingest")).is_empty());
    assert!(files_in(&dir.path().join("layers")).is_empty());
    assert_eq!(blob_count(dir.path()), 0);
    // The store still works for what fits.
    images.pull(&set.busybox.reference, "", None, None).await.unwrap();
    drop(images);
    let images = open(dir.path());
    assert_eq!(images.list(None).unwrap().len(), 1);
}
