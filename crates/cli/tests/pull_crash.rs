//! Crash safety of pulls, end to end (issue 3, acceptance 4): the real `berth runtime` is killed
//! with SIGKILL in the middle of `berth cri pull`, restarted on the same root, and the store must
//! show nothing half-done while the next pull completes, reusing what the killed one stored.
//!
//! The registry is reached through a [`ThrottledProxy`] so that a download takes seconds instead
//! of milliseconds (and so we can count the bytes each pull fetched).

mod common_cri;

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use berth_testenv::images::{Image, pseudo_random_bytes, sha256_digest};
use berth_testenv::{PushedImage, Registry, ThrottledProxy};
use common_cri::{Runtime, files_with_sizes, rows, sha256_file};

/// `push_big`: this many MB in 5 gzip layers of incompressible data.
const SIZE_MB: usize = 60;
/// Registry → runtime while the first pull runs: 60 MB take about 4 s.
const SLOW_RATE: u64 = 16 << 20;
/// The download test kills the runtime once this much sits in partial downloads.
const KILL_AT_INGEST: u64 = 12 << 20;
/// Bytes a retried pull may fetch beyond the blobs' missing parts: manifest, config, headers.
const SLACK: u64 = 1 << 20;
/// Debug logs of the image crate show whether a download resumed.
const LOG_FILTER: (&str, &str) = ("BERTH_LOG", "info,berth_image=debug");

/// The first `size` MB of `big/<i>.bin` in layer `i` of `push_big(size)` (see `big_image`).
fn big_file(i: usize, layers: usize) -> Vec<u8> {
    pseudo_random_bytes(0xB16 + i as u64, SIZE_MB * 1024 * 1024 / layers)
}

/// Chain ids (hex) of the image's layers, lowest first: the names of its unpacked layer dirs.
fn chain_ids(image: &Image) -> Vec<String> {
    let mut chains: Vec<String> = Vec::new();
    for diff_id in image.diff_ids() {
        let next = match chains.last() {
            None => diff_id,
            Some(parent) => sha256_digest(format!("{parent} {diff_id}").as_bytes()),
        };
        chains.push(next);
    }
    chains.into_iter().map(|c| c.trim_start_matches("sha256:").to_string()).collect()
}

/// Every file under `dir`, recursively, as paths relative to it.
fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// What a store holds, once checked for consistency.
#[derive(Debug, Default)]
struct StoreState {
    /// Layer blobs committed under `blobs/` (bytes).
    layer_blob_bytes: u64,
    /// Bytes in partial downloads under `ingest/`.
    ingest_bytes: u64,
    ingest_files: usize,
    /// Complete (renamed into place) layer dirs, by layer index.
    unpacked: Vec<usize>,
    /// Half-unpacked layer dirs (`layers/.tmp-*`), which a restart must remove.
    tmp_layers: usize,
    records: Vec<String>,
}

/// Checks the rules that make a crash harmless and reports what is there:
/// - every blob under `blobs/sha256/` hashes to its name and belongs to the image;
/// - every ingest file is a prefix of the layer blob it is named after (or a `.tmp` of a small
///   blob), never longer than it;
/// - every complete layer dir holds exactly its layer's file, byte for byte;
/// - nothing else is in `layers/` but half-unpacked `.tmp-*` dirs.
fn check_store(store: &Path, big: &PushedImage) -> StoreState {
    let image = &big.image;
    let n = image.layers.len();
    let mut state = StoreState::default();
    let mut known: Vec<String> = vec![big.digest().to_string(), image.config_digest.clone()];
    known.extend(image.layer_digests());

    for (name, size) in files_with_sizes(&store.join("blobs/sha256")) {
        let digest = format!("sha256:{name}");
        assert!(known.contains(&digest), "blob {digest} is not part of the image");
        assert_eq!(sha256_file(&store.join("blobs/sha256").join(&name)), digest, "blob {name} is corrupt");
        if let Some(layer) = image.layers.iter().find(|l| l.digest == digest) {
            assert_eq!(size, layer.size());
            state.layer_blob_bytes += size;
        }
    }

    for (name, size) in files_with_sizes(&store.join("ingest")) {
        if name.ends_with(".tmp") {
            continue; // a small blob caught mid-write; the next open removes it
        }
        let digest = format!("sha256:{name}");
        let layer = image
            .layers
            .iter()
            .find(|l| l.digest == digest)
            .unwrap_or_else(|| panic!("ingest {name} is not a layer of the image"));
        assert!(size <= layer.size(), "ingest {name} holds {size} bytes, the blob has {}", layer.size());
        let bytes = std::fs::read(store.join("ingest").join(&name)).unwrap();
        assert!(bytes[..] == layer.blob[..bytes.len()], "ingest {name} is not a prefix of its blob");
        state.ingest_bytes += size;
        state.ingest_files += 1;
    }

    let chains = chain_ids(image);
    if let Ok(entries) = std::fs::read_dir(store.join("layers")) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(".tmp-") {
                state.tmp_layers += 1;
                continue;
            }
            let i = chains.iter().position(|c| *c == name).unwrap_or_else(|| panic!("unknown layer dir {name}"));
            let files = walk(&entry.path());
            assert_eq!(files, [format!("big/{i}.bin")], "layer dir {name} (layer {i})");
            let data = std::fs::read(entry.path().join(&files[0])).unwrap();
            assert!(data == big_file(i, n), "layer {i}: big/{i}.bin differs from the image's");
            state.unpacked.push(i);
        }
    }
    state.unpacked.sort();
    state.records = walk(&store.join("records")).into_iter().filter(|f| f.ends_with(".json")).collect();
    state
}

/// Waits for the background `berth cri pull` and asserts it failed (its server died under it).
fn assert_pull_failed(pull: Child) -> String {
    let out = pull.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "the interrupted pull succeeded: {stdout}");
    assert!(!stdout.contains("Image is up to date"), "{stdout}");
    assert!(!stderr.trim().is_empty(), "the interrupted pull failed without saying why");
    stderr.into_owned()
}

/// After a restart: no image listed, no record, no half-unpacked layer; partial downloads kept.
fn assert_nothing_half_visible(rt: &Runtime, big: &PushedImage, before_restart: &StoreState) -> StoreState {
    let table = rt.ok(&["images"]);
    assert!(rows(&table).is_empty(), "an interrupted pull is listed:\n{table}");
    assert!(rt.ok(&["images", "-q"]).trim().is_empty());
    let inspect = rt.cri(&["inspecti", &big.reference]);
    assert!(!inspect.status.success(), "inspecti found the interrupted image");
    let state = check_store(&rt.images_root(), big);
    assert!(state.records.is_empty(), "records after an interrupted pull: {:?}", state.records);
    assert_eq!(state.tmp_layers, 0, "half-unpacked layers survived the restart");
    assert_eq!(state.ingest_bytes, before_restart.ingest_bytes, "partial downloads are kept to resume");
    assert_eq!(state.layer_blob_bytes, before_restart.layer_blob_bytes, "committed blobs are kept");
    state
}

/// Pulls again and checks the result is complete, listed once, inspectable, and that only what
/// the killed pull had not stored was fetched again. Returns the bytes fetched.
fn pull_again_and_check(
    rt: &Runtime,
    proxy: &ThrottledProxy,
    reference: &str,
    big: &PushedImage,
    had: &StoreState,
) -> u64 {
    let image = &big.image;
    let fetched_before = proxy.bytes_down();
    let out = rt.ok(&["pull", reference]);
    assert_eq!(out, format!("Image is up to date for {}\n", image.config_digest));
    let fetched = proxy.bytes_down() - fetched_before;
    let missing = image.layers_size() - had.layer_blob_bytes - had.ingest_bytes;
    assert!(
        fetched <= missing + SLACK,
        "the second pull fetched {fetched} bytes; only {missing} of the layers were missing \
         (store had {} committed + {} partial)",
        had.layer_blob_bytes,
        had.ingest_bytes
    );

    let table = rt.ok(&["images"]);
    let listed = rows(&table);
    let (repo, tag) = reference.rsplit_once(':').unwrap();
    assert_eq!(listed.len(), 1, "{table}");
    assert_eq!((listed[0][0].as_str(), listed[0][1].as_str()), (repo, tag), "{table}");
    assert_eq!(listed[0][3], "runc");
    assert_eq!(rt.ok(&["images", "-q"]), format!("{}\n", image.config_digest));

    let inspect: serde_json::Value = serde_json::from_str(&rt.ok(&["inspecti", reference])).unwrap();
    assert_eq!(inspect["status"]["id"], image.config_digest.as_str());
    assert_eq!(inspect["status"]["repoTags"][0], reference);
    assert_eq!(inspect["status"]["spec"]["runtimeHandler"], "runc");

    let state = check_store(&rt.images_root(), big);
    assert_eq!(state.unpacked, (0..image.layers.len()).collect::<Vec<_>>(), "every layer unpacked");
    assert_eq!(state.tmp_layers, 0);
    assert_eq!(state.ingest_files, 0, "no partial download left");
    assert_eq!(state.layer_blob_bytes, image.layers_size());
    assert_eq!(state.records.len(), 1, "{:?}", state.records);
    assert_eq!(files_with_sizes(&rt.images_root().join("blobs/sha256")).len(), image.layers.len() + 2);
    fetched
}

/// Polls `cond` on the store until it holds; panics if the pull ended first or time runs out.
fn wait_for(rt: &Runtime, pull: &mut Child, what: &str, mut cond: impl FnMut(&Path) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let store = rt.images_root();
    loop {
        if cond(&store) {
            return;
        }
        if let Some(status) = pull.try_wait().unwrap() {
            panic!("the pull ended ({status}) before {what}; runtime log:\n{}", rt.log());
        }
        assert!(Instant::now() < deadline, "no {what} after 120 s; runtime log:\n{}", rt.log());
        std::thread::sleep(Duration::from_millis(1));
    }
}

async fn setup() -> (Registry, PushedImage, ThrottledProxy, String) {
    let registry = Registry::start();
    let mut big = registry.push_big(SIZE_MB).await;
    let proxy = ThrottledProxy::start(registry.host(), SLOW_RATE);
    // The runtime pulls through the proxy: the same image under the proxy's host.
    let reference = proxy.reference("big:1.0");
    big.reference = reference.clone();
    (registry, big, proxy, reference)
}

#[tokio::test]
async fn a_pull_interrupted_by_kill_9_completes_after_restart_and_the_store_stays_consistent() {
    let (_registry, big, proxy, reference) = setup().await;
    let layers_size = big.image.layers_size();
    let mut rt = Runtime::start_with_env(&[&proxy.host()], &[LOG_FILTER]);

    let mut pull = rt.cri_spawn(&["pull", &reference]);
    wait_for(&rt, &mut pull, "partial downloads", |store| {
        files_with_sizes(&store.join("ingest")).iter().map(|(_, s)| s).sum::<u64>() >= KILL_AT_INGEST
    });
    rt.kill9();
    let fetched_first = proxy.bytes_down();
    let error = assert_pull_failed(pull);

    let killed = check_store(&rt.images_root(), &big);
    assert!(killed.records.is_empty(), "a record before the layers were in: {:?}", killed.records);
    assert!(killed.ingest_bytes >= KILL_AT_INGEST, "{killed:?}");
    assert!(killed.layer_blob_bytes + killed.ingest_bytes < layers_size, "the kill came too late: {killed:?}");

    rt.restart();
    let resumed_from = assert_nothing_half_visible(&rt, &big, &killed);
    // Full speed for the rest; what counts is how much is fetched, not how fast.
    proxy.set_rate(None);
    let fetched = pull_again_and_check(&rt, &proxy, &reference, &big, &resumed_from);
    let log = rt.log();
    assert!(log.contains("resuming blob download"), "no download resumed; runtime log:\n{log}");
    eprintln!(
        "layers {layers_size} B; first pull fetched {fetched_first} B before kill -9 ({} B on disk in \
         {} partial downloads); after restart the pull fetched {fetched} B; client said: {}",
        killed.ingest_bytes,
        killed.ingest_files,
        // The reason, without the backtrace anyhow adds under RUST_BACKTRACE=1.
        error.split("Stack backtrace").next().unwrap_or_default().trim().replace('\n', " ")
    );
    rt.stop();
}

#[tokio::test]
async fn a_pull_killed_while_unpacking_leaves_no_half_layer_and_completes_after_restart() {
    let (_registry, big, proxy, reference) = setup().await;
    // Downloads at full speed: the kill is aimed at the unpacking.
    proxy.set_rate(None);
    let mut rt = Runtime::start_with_env(&[&proxy.host()], &[LOG_FILTER]);

    let mut pull = rt.cri_spawn(&["pull", &reference]);
    wait_for(&rt, &mut pull, "a layer being unpacked", |store| {
        std::fs::read_dir(store.join("layers"))
            .map(|entries| entries.flatten().any(|e| e.file_name().to_string_lossy().starts_with(".tmp-")))
            .unwrap_or(false)
    });
    rt.kill9();
    assert_pull_failed(pull);

    let killed = check_store(&rt.images_root(), &big);
    assert!(killed.records.is_empty(), "a record before the layers were in: {:?}", killed.records);
    assert!(killed.tmp_layers > 0, "the kill missed the unpacking: {killed:?}");
    assert!(killed.layer_blob_bytes > 0, "a layer is unpacked only once its blob is stored: {killed:?}");

    rt.restart();
    let had = assert_nothing_half_visible(&rt, &big, &killed);
    assert_eq!(had.unpacked, killed.unpacked, "complete layers are kept");
    let fetched = pull_again_and_check(&rt, &proxy, &reference, &big, &had);
    eprintln!(
        "killed with {} layer(s) half unpacked, {:?} complete, {} B of blobs stored; the retry fetched {fetched} B",
        killed.tmp_layers, killed.unpacked, killed.layer_blob_bytes
    );
    rt.stop();
}
