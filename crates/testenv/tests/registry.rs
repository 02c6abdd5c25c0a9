//! The test environment against the real `docker-registry`: the standard set as served, basic
//! auth, the token flow with plain reqwest, TLS, blob paths, and etcd.

use berth_testenv::images::{DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST, Platform, sha256_digest};
use berth_testenv::{Etcd, Registry};
use reqwest::StatusCode;
use serde_json::Value;

const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json";

/// GET a manifest with every media type accepted: (status, content type, digest header, body).
async fn get_manifest(
    reg: &Registry,
    repo: &str,
    reference: &str,
    bearer: Option<&str>,
) -> (StatusCode, String, String, Vec<u8>) {
    let mut rb = reg.client().get(reg.url(&format!("/v2/{repo}/manifests/{reference}"))).header("accept", ACCEPT);
    if let Some(t) = bearer {
        rb = rb.bearer_auth(t);
    } else if let Some((u, p)) =
        reg.credentials().filter(|_| matches!(reg.auth(), berth_testenv::RegistryAuth::Basic { .. }))
    {
        rb = rb.basic_auth(u, Some(p));
    }
    let r = rb.send().await.unwrap();
    let h = |n: &str| r.headers().get(n).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let (status, ct, dg) = (r.status(), h("content-type"), h("docker-content-digest"));
    (status, ct, dg, r.bytes().await.unwrap().to_vec())
}

async fn get_blob(reg: &Registry, repo: &str, digest: &str) -> Vec<u8> {
    let mut rb = reg.client().get(reg.url(&format!("/v2/{repo}/blobs/{digest}")));
    if let Some((u, p)) = reg.credentials() {
        rb = rb.basic_auth(u, Some(p));
    }
    let r = rb.send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "blob {digest}");
    r.bytes().await.unwrap().to_vec()
}

#[tokio::test]
async fn standard_set_is_served_as_built() {
    let reg = Registry::start();
    let set = reg.push_standard_set().await;
    assert_eq!(set.busybox.reference, format!("{}/busybox:latest", reg.host()));

    for img in set.images() {
        let (status, ct, digest, body) = get_manifest(&reg, &img.repo, &img.tag, None).await;
        assert_eq!(status, StatusCode::OK, "{}", img.reference);
        assert_eq!(ct, OCI_MANIFEST);
        assert_eq!(digest, img.digest());
        assert_eq!(sha256_digest(&body), img.digest());
        for l in &img.image.layers {
            assert_eq!(sha256_digest(&get_blob(&reg, &img.repo, &l.digest).await), l.digest);
        }
        let cfg: Value = serde_json::from_slice(&get_blob(&reg, &img.repo, &img.image.config_digest).await).unwrap();
        assert_eq!(cfg["rootfs"]["diff_ids"], serde_json::json!(img.image.diff_ids()));
    }
    assert_eq!(set.busybox.digest(), set.library_busybox.digest());
    assert_eq!(set.whiteout.image.layers.len(), 2);

    for (idx, media_type, entry_type) in
        [(&set.multi, OCI_INDEX, OCI_MANIFEST), (&set.multi_docker, DOCKER_LIST, DOCKER_MANIFEST)]
    {
        let (status, ct, digest, body) = get_manifest(&reg, "multi", &idx.tag, None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(ct, media_type);
        assert_eq!(digest, idx.digest());
        let v: Value = serde_json::from_slice(&body).unwrap();
        let entries = v["manifests"].as_array().unwrap();
        assert_eq!(entries.len(), 4);
        let versions: Vec<&str> = entries.iter().filter_map(|e| e["platform"]["os.version"].as_str()).collect();
        assert_eq!(versions, ["10.0.20348.1970", "10.0.17763.4851"]);
        assert_eq!(entries[1]["platform"]["variant"], "v8");
        let mut configs: Vec<&str> = idx.index.images.iter().map(|i| i.config_digest.as_str()).collect();
        configs.dedup();
        assert_eq!(configs.len(), 4, "each entry has its own config");
        let layer = &idx.index.images[0].layers[0].digest;
        assert!(idx.index.images.iter().all(|i| &i.layers[0].digest == layer), "one shared layer blob");
        for (e, img) in entries.iter().zip(&idx.index.images) {
            assert_eq!(e["mediaType"], entry_type);
            let (status, _, digest, _) = get_manifest(&reg, "multi", e["digest"].as_str().unwrap(), None).await;
            assert_eq!((status, digest.as_str()), (StatusCode::OK, img.manifest_digest.as_str()));
        }
    }
    let arm = set.multi.index.image_for(&Platform::parse("linux/arm64/v8")).unwrap();
    let cfg: Value = serde_json::from_slice(&arm.config_json).unwrap();
    assert_eq!((cfg["architecture"].as_str(), cfg["variant"].as_str()), (Some("arm64"), Some("v8")));
}

#[tokio::test]
async fn blob_path_points_at_the_stored_bytes() {
    let reg = Registry::start();
    let set = reg.push_standard_set().await;
    let layer = &set.plain.image.layers[0];
    let path = reg.blob_path(&layer.digest);
    assert_eq!(std::fs::read(&path).unwrap(), layer.blob);
    let mut bad = layer.blob.to_vec();
    bad[600] ^= 0xff;
    std::fs::write(&path, &bad).unwrap();
    // distribution does not verify on read: clients see the corrupt bytes.
    assert_ne!(sha256_digest(&get_blob(&reg, "plain", &layer.digest).await), layer.digest);
}

#[tokio::test]
async fn basic_auth_refuses_without_credentials() {
    let reg = Registry::start_basic_auth("testuser", "testpassword");
    let set = reg.push_standard_set().await;
    let c = reg.client();
    let anon = c.get(reg.url("/v2/")).send().await.unwrap();
    assert_eq!(anon.status(), StatusCode::UNAUTHORIZED);
    let challenge = anon.headers()["www-authenticate"].to_str().unwrap().to_owned();
    assert!(challenge.starts_with("Basic realm="), "{challenge}");
    let wrong = c.get(reg.url("/v2/")).basic_auth("testuser", Some("nope")).send().await.unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let ok = c.get(reg.url("/v2/")).basic_auth("testuser", Some("testpassword")).send().await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let (status, _, digest, _) = get_manifest(&reg, "private/app", "1.0", None).await;
    assert_eq!((status, digest.as_str()), (StatusCode::OK, set.private_app.digest()));
}

fn url_encode(fields: &[(&str, &str)]) -> String {
    fields
        .iter()
        .map(|(k, v)| {
            format!("{k}={}", v.replace('%', "%25").replace('/', "%2F").replace(':', "%3A").replace(',', "%2C"))
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// The `key="value"` parameters of a `WWW-Authenticate: Bearer …` challenge.
fn bearer_params(challenge: &str) -> std::collections::HashMap<String, String> {
    let rest = challenge.strip_prefix("Bearer ").unwrap_or_else(|| panic!("not a Bearer challenge: {challenge}"));
    let mut out = std::collections::HashMap::new();
    for part in rest.split("\",") {
        let (k, v) = part.split_once('=').unwrap();
        out.insert(k.trim().to_owned(), v.trim_matches('"').to_owned());
    }
    out
}

#[tokio::test]
async fn token_flow_with_plain_reqwest() {
    let reg = Registry::builder().token_auth("alice", "s3cret").public_repo("library/").start();
    let set = reg.push_standard_set().await;
    let c = reg.client();

    // Anonymous: 401 with a Bearer challenge naming realm, service and scope.
    let (status, ..) = get_manifest(&reg, "private/app", "1.0", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let r = c.get(reg.url("/v2/private/app/manifests/1.0")).send().await.unwrap();
    let p = bearer_params(r.headers()["www-authenticate"].to_str().unwrap());
    assert_eq!(p["realm"], reg.token_server().unwrap().realm());
    assert_eq!(p["service"], berth_testenv::token::SERVICE);
    assert_eq!(p["scope"], "repository:private/app:pull");

    let fetch = |user: Option<(&'static str, &'static str)>, scope: String| {
        let mut rb = c.get(&p["realm"]).query(&[("service", p["service"].as_str()), ("scope", scope.as_str())]);
        if let Some((u, pw)) = user {
            rb = rb.basic_auth(u, Some(pw));
        }
        rb.send()
    };

    // Right credentials: a token that opens the manifest.
    let r = fetch(Some(("alice", "s3cret")), p["scope"].clone()).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    let token = body["token"].as_str().unwrap().to_owned();
    assert_eq!(body["access_token"].as_str(), Some(token.as_str()));
    let (status, _, digest, _) = get_manifest(&reg, "private/app", "1.0", Some(&token)).await;
    assert_eq!((status, digest.as_str()), (StatusCode::OK, set.private_app.digest()));
    // The token is scoped to that repository.
    let (status, ..) = get_manifest(&reg, "busybox", "latest", Some(&token)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Wrong credentials: the token server refuses.
    let r = fetch(Some(("alice", "wrong")), p["scope"].clone()).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(reg.token_server().unwrap().refused(), 1);

    // No credentials: a token, but without access to a private repository...
    let r = fetch(None, p["scope"].clone()).await.unwrap();
    let anon: Value = r.json().await.unwrap();
    let (status, ..) = get_manifest(&reg, "private/app", "1.0", anon["token"].as_str()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // ...and with pull access to a public one.
    let r = fetch(None, "repository:library/busybox:pull".into()).await.unwrap();
    let anon: Value = r.json().await.unwrap();
    let (status, _, digest, _) = get_manifest(&reg, "library/busybox", "latest", anon["token"].as_str()).await;
    assert_eq!((status, digest.as_str()), (StatusCode::OK, set.library_busybox.digest()));

    // The OAuth2 password grant (POST) that containerd uses when it has a secret.
    let form = [
        ("grant_type", "password"),
        ("username", "alice"),
        ("password", "s3cret"),
        ("service", p["service"].as_str()),
        ("scope", p["scope"].as_str()),
        ("client_id", "test"),
    ];
    let body = url_encode(&form);
    let r = c
        .post(&p["realm"])
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let posted: Value = r.json().await.unwrap();
    let (status, ..) = get_manifest(&reg, "private/app", "1.0", posted["access_token"].as_str()).await;
    assert_eq!(status, StatusCode::OK);
    let bad = url_encode(&[("grant_type", "password"), ("username", "alice"), ("password", "x")]);
    let r =
        c.post(&p["realm"]).header("content-type", "application/x-www-form-urlencoded").body(bad).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);

    // A token signed by a key the registry does not trust is refused.
    let foreign = berth_testenv::TokenServer::start(berth_testenv::token::TokenPolicy {
        user: "alice".into(),
        password: "s3cret".into(),
        public_repos: vec![],
    });
    let forged =
        foreign.sign("alice", &[("private/app".into(), vec!["pull".into()])], std::time::Duration::from_secs(60));
    let (status, ..) = get_manifest(&reg, "private/app", "1.0", Some(&forged)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn tls_registry_is_trusted_through_its_ca() {
    let reg = Registry::start_tls();
    assert!(reg.base_url().starts_with("https://127.0.0.1:"));
    assert!(reg.ca_pem().unwrap().contains("BEGIN CERTIFICATE"));
    let set = reg.push_standard_set().await;
    let (status, _, digest, _) = get_manifest(&reg, "busybox", "latest", None).await;
    assert_eq!((status, digest.as_str()), (StatusCode::OK, set.busybox.digest()));
    // A client without the CA does not get through.
    let plain = reqwest::Client::builder().no_proxy().build().unwrap();
    assert!(plain.get(reg.url("/v2/")).send().await.is_err());
}

#[tokio::test]
async fn token_auth_over_tls() {
    let reg = Registry::builder().token_auth("u", "p").tls().start();
    let set = reg.push_standard_set().await;
    let token = reg.token("repository:busybox:pull").await;
    let (status, _, digest, _) = get_manifest(&reg, "busybox", "latest", Some(&token)).await;
    assert_eq!((status, digest.as_str()), (StatusCode::OK, set.busybox.digest()));
}

#[tokio::test]
async fn big_image_pushes_in_layers() {
    let reg = Registry::start();
    let big = reg.push_big(10).await;
    assert_eq!(big.reference, format!("{}/big:1.0", reg.host()));
    assert_eq!(big.image.layers.len(), 5);
    assert!(big.image.layers_size() > 10 * 1024 * 1024, "incompressible");
    let (status, _, digest, _) = get_manifest(&reg, "big", "1.0", None).await;
    assert_eq!((status, digest.as_str()), (StatusCode::OK, big.digest()));
}

#[tokio::test]
async fn stopped_registry_is_unreachable() {
    let mut reg = Registry::start();
    assert!(reg.client().get(reg.url("/v2/")).send().await.unwrap().status().is_success());
    reg.stop();
    assert!(reg.client().get(reg.url("/v2/")).send().await.is_err());
}

/// A registry shared by a whole test binary through a `static`, filled from sync code.
#[test]
fn registry_in_a_static_and_from_sync_code() {
    static SHARED: std::sync::OnceLock<(Registry, berth_testenv::StandardSet)> = std::sync::OnceLock::new();
    let (reg, set) = SHARED.get_or_init(|| {
        let reg = Registry::start();
        let set = berth_testenv::block_on(reg.push_standard_set());
        (reg, set)
    });
    let got = berth_testenv::block_on(async { get_manifest(reg, "zstd", "1.0", None).await.2 });
    assert_eq!(got, set.zstd.digest());
}

#[test]
fn etcd_starts_and_answers() {
    let etcd = Etcd::start();
    assert!(etcd.endpoint().starts_with("http://127.0.0.1:"));
    let out = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", etcd.endpoint(), "put", "k", "v"])
        .output();
    if let Ok(out) = out {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

/// Runs a command and panics with its output when it fails.
fn run(cmd: &str, args: &[&str]) {
    let out = std::process::Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Independent clients accept what we generate: skopeo copies the images (verifying digests),
/// umoci unpacks them (verifying diff_ids and applying whiteouts).
#[tokio::test]
async fn skopeo_and_umoci_accept_the_images() {
    use std::os::unix::fs::MetadataExt;
    let reg = Registry::start();
    reg.push_standard_set().await;
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("oci");
    let oci = |tag: &str| format!("{}:{tag}", layout.display());
    let host = reg.host().to_owned();
    let layout2 = layout.clone();
    tokio::task::spawn_blocking(move || {
        let oci = |tag: &str| format!("{}:{tag}", layout2.display());
        for (src, tag) in
            [("busybox:latest", "busybox"), ("whiteout:1.0", "whiteout"), ("zstd:1.0", "zstd"), ("plain:1.0", "plain")]
        {
            run(
                "skopeo",
                &[
                    "copy",
                    "-q",
                    "--src-tls-verify=false",
                    &format!("docker://{host}/{src}"),
                    &format!("oci:{}", oci(tag)),
                ],
            );
        }
        for tag in ["1.0", "1.0-docker"] {
            run(
                "skopeo",
                &[
                    "copy",
                    "-q",
                    "--all",
                    "--src-tls-verify=false",
                    &format!("docker://{host}/multi:{tag}"),
                    &format!("oci:{}", oci(&format!("multi-{tag}"))),
                ],
            );
        }
    })
    .await
    .unwrap();

    let bundle = |tag: &str| {
        let b = tmp.path().join(format!("bundle-{tag}"));
        run("umoci", &["unpack", "--image", &oci(tag), b.to_str().unwrap()]);
        b.join("rootfs")
    };
    let bb = bundle("busybox");
    let (sh, busybox) =
        (std::fs::metadata(bb.join("bin/sh")).unwrap(), std::fs::metadata(bb.join("bin/busybox")).unwrap());
    assert_eq!(sh.ino(), busybox.ino(), "applets are hard links");
    assert_eq!(std::fs::metadata(bb.join("tmp")).unwrap().mode() & 0o7777, 0o1777);
    let out = std::process::Command::new(bb.join("bin/busybox")).arg("true").status().unwrap();
    assert!(out.success());

    let wo = bundle("whiteout");
    assert!(wo.join("a/keep").exists());
    assert!(!wo.join("a/gone").exists(), "whiteout applied");
    assert!(!wo.join("d/old").exists(), "opaque dir applied");
    assert!(wo.join("d/new").exists());

    let z = bundle("plain");
    assert_eq!(std::fs::metadata(z.join("home/app/data")).unwrap().uid(), 1000);
    assert_eq!(std::fs::read_link(z.join("data")).unwrap(), std::path::Path::new("home/app/data"));
}

#[tokio::test]
async fn pause_image_runs_and_stops_on_sigterm() {
    let reg = Registry::start();
    let pause = reg.push_pause().await;
    assert_eq!(pause.reference, format!("{}/pause:3.9", reg.host()));
    let (status, _, digest, _) = get_manifest(&reg, "pause", "3.9", None).await;
    assert_eq!((status, digest.as_str()), (StatusCode::OK, pause.digest()));
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("pause");
    std::fs::write(&bin, berth_testenv::images::pause_binary()).unwrap();
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut child = std::process::Command::new(&bin).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(child.try_wait().unwrap().is_none(), "pause keeps running");
    let ok = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(ok.success());
    assert_eq!(child.wait().unwrap().code(), Some(0));
}
