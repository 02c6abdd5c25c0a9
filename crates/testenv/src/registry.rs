//! A real registry on loopback: Debian's `docker-registry` (distribution 2.8) in a temp dir,
//! plain, with htpasswd basic auth, or with our token server, over HTTP or HTTPS; and pushing
//! generated images to it through the registry HTTP API.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::{RequestBuilder, StatusCode};

use crate::daemon::{Daemon, free_port, require_binary};
use crate::images::{Image, Index};
use crate::tls::TestCa;
use crate::token::{SERVICE, TokenPolicy, TokenServer};

pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";
pub const HTPASSWD_BIN: &str = "/usr/bin/htpasswd";

/// How clients authenticate to a [`Registry`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistryAuth {
    None,
    /// htpasswd (bcrypt) basic auth.
    Basic {
        user: String,
        password: String,
    },
    /// Bearer tokens from our token server, which takes these basic credentials.
    Token {
        user: String,
        password: String,
    },
}

/// Options for [`Registry`]; `Registry::start*` are shortcuts for the common ones.
#[derive(Clone, Debug)]
pub struct RegistryBuilder {
    auth: RegistryAuth,
    tls: bool,
    public_repos: Vec<String>,
}

impl Default for RegistryBuilder {
    fn default() -> Self {
        RegistryBuilder { auth: RegistryAuth::None, tls: false, public_repos: Vec::new() }
    }
}

impl RegistryBuilder {
    pub fn basic_auth(mut self, user: &str, password: &str) -> Self {
        self.auth = RegistryAuth::Basic { user: user.into(), password: password.into() };
        self
    }
    pub fn token_auth(mut self, user: &str, password: &str) -> Self {
        self.auth = RegistryAuth::Token { user: user.into(), password: password.into() };
        self
    }
    /// With token auth: repositories (exact, or prefixes ending in `/`) that anonymous clients
    /// get pull tokens for, as on Docker Hub. Everything else needs the credentials.
    pub fn public_repo(mut self, repo: &str) -> Self {
        self.public_repos.push(repo.into());
        self
    }
    /// Serve HTTPS with a certificate for 127.0.0.1/localhost from a fresh CA ([`Registry::ca_pem`]).
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Starts the registry and waits until it accepts connections. Panics with the registry's
    /// log if it does not come up, and with install advice if the binary is missing.
    pub fn start(self) -> Registry {
        require_binary(REGISTRY_BIN, "docker-registry");
        let dir = tempfile::Builder::new().prefix("berth-testenv-registry.").tempdir().expect("tempdir");
        let root = dir.path().join("data");
        std::fs::create_dir_all(&root).expect("registry data dir");

        let mut tls_yaml = String::new();
        let ca = self.tls.then(|| {
            let ca = TestCa::new("berth-testenv registry CA");
            let cert = ca.server_cert(&["127.0.0.1", "localhost"]);
            let (c, k) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
            std::fs::write(&c, &cert.cert_pem).expect("write tls cert");
            std::fs::write(&k, &cert.key_pem).expect("write tls key");
            tls_yaml = format!("  tls:\n    certificate: {}\n    key: {}\n", c.display(), k.display());
            ca.cert_pem
        });

        let mut token = None;
        let auth_yaml = match &self.auth {
            RegistryAuth::None => String::new(),
            RegistryAuth::Basic { user, password } => {
                let path = dir.path().join("htpasswd");
                std::fs::write(&path, htpasswd_line(user, password)).expect("write htpasswd");
                format!("auth:\n  htpasswd:\n    realm: berth-testenv\n    path: {}\n", path.display())
            }
            RegistryAuth::Token { user, password } => {
                let ts = TokenServer::start(TokenPolicy {
                    user: user.clone(),
                    password: password.clone(),
                    public_repos: self.public_repos.clone(),
                });
                let bundle = dir.path().join("token-root.pem");
                std::fs::write(&bundle, ts.root_cert_pem()).expect("write rootcertbundle");
                let yaml = format!(
                    "auth:\n  token:\n    realm: {}\n    service: {SERVICE}\n    issuer: {}\n    rootcertbundle: {}\n",
                    ts.realm(),
                    crate::token::ISSUER,
                    bundle.display()
                );
                token = Some(ts);
                yaml
            }
        };

        let log_path = dir.path().join("registry.log");
        let config_path = dir.path().join("config.yml");
        // The port is picked before the registry binds it; another process may win the race, so
        // retry with a fresh port when the registry exits early.
        for _attempt in 0..5 {
            let port = free_port();
            let config = format!(
                "version: 0.1\n\
                 log:\n  level: info\n  accesslog:\n    disabled: true\n\
                 storage:\n  filesystem:\n    rootdirectory: {root}\n  delete:\n    enabled: true\n  \
                 maintenance:\n    uploadpurging:\n      enabled: false\n\
                 http:\n  addr: 127.0.0.1:{port}\n  secret: berth-testenv-{port}\n{tls_yaml}\
                 health:\n  storagedriver:\n    enabled: false\n\
                 {auth_yaml}",
                root = root.display(),
            );
            // No blob descriptor cache on purpose: tests corrupt and delete blobs on disk.
            std::fs::write(&config_path, config).expect("write registry config");
            let mut daemon = Daemon::spawn(
                REGISTRY_BIN,
                &["serve".into(), config_path.display().to_string()],
                &log_path,
                Some(dir.path()),
            );
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    let mut client = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(300));
                    if let Some(pem) = &ca {
                        client = client
                            .add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).expect("CA pem"));
                    }
                    return Registry {
                        host: format!("127.0.0.1:{port}"),
                        auth: self.auth,
                        ca_pem: ca,
                        client: client.build().expect("reqwest client"),
                        push_tokens: Mutex::new(HashMap::new()),
                        root,
                        token,
                        daemon,
                        dir,
                    };
                }
                if daemon.exited().is_some() {
                    break;
                }
                if Instant::now() > deadline {
                    panic!("docker-registry did not listen on {addr} within 15 s; log:\n{}", daemon.log());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let log = daemon.log();
            if !log.contains("address already in use") {
                panic!("docker-registry exited at start; config:\n{}\nlog:\n{log}", config_path.display());
            }
        }
        panic!(
            "docker-registry: no free port after 5 attempts; log:\n{}",
            std::fs::read_to_string(log_path).unwrap_or_default()
        );
    }
}

/// A bcrypt htpasswd line (distribution accepts no other hash), made by apache2-utils.
fn htpasswd_line(user: &str, password: &str) -> String {
    require_binary(HTPASSWD_BIN, "apache2-utils");
    let out = std::process::Command::new(HTPASSWD_BIN)
        .args(["-B", "-b", "-n", user, password])
        .output()
        .expect("run htpasswd");
    assert!(out.status.success(), "htpasswd failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("htpasswd output").trim().to_owned() + "\n"
}

/// A running `docker-registry`; killed and its storage deleted on drop.
pub struct Registry {
    host: String,
    auth: RegistryAuth,
    ca_pem: Option<String>,
    client: reqwest::Client,
    /// Bearer tokens for our own pushes, per repository.
    push_tokens: Mutex<HashMap<String, String>>,
    root: PathBuf,
    token: Option<TokenServer>,
    // Dropped in this order: the registry stops before its temp dir goes.
    daemon: Daemon,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("url", &self.base_url()).field("auth", &self.auth).finish()
    }
}

impl Registry {
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder::default()
    }
    /// Plain HTTP, no auth.
    pub fn start() -> Registry {
        Self::builder().start()
    }
    /// htpasswd basic auth over plain HTTP.
    pub fn start_basic_auth(user: &str, password: &str) -> Registry {
        Self::builder().basic_auth(user, password).start()
    }
    /// Bearer tokens from our token server (which checks `user`/`password`), plain HTTP.
    pub fn start_token_auth(user: &str, password: &str) -> Registry {
        Self::builder().token_auth(user, password).start()
    }
    /// HTTPS with a fresh CA, no auth.
    pub fn start_tls() -> Registry {
        Self::builder().tls().start()
    }

    /// `127.0.0.1:PORT`: the registry part of image references.
    pub fn host(&self) -> &str {
        &self.host
    }
    pub fn scheme(&self) -> &'static str {
        if self.ca_pem.is_some() { "https" } else { "http" }
    }
    /// `http://127.0.0.1:PORT` (or https).
    pub fn base_url(&self) -> String {
        format!("{}://{}", self.scheme(), self.host)
    }
    /// `base_url() + path`, e.g. `reg.url("/v2/")`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url())
    }
    /// `127.0.0.1:PORT/<name>`, e.g. `reg.reference("busybox:latest")`.
    pub fn reference(&self, name: &str) -> String {
        format!("{}/{name}", self.host)
    }
    /// PEM of the CA that signed the serving certificate, when started with TLS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }
    pub fn auth(&self) -> &RegistryAuth {
        &self.auth
    }
    /// `(user, password)` when the registry has auth.
    pub fn credentials(&self) -> Option<(&str, &str)> {
        match &self.auth {
            RegistryAuth::None => None,
            RegistryAuth::Basic { user, password } | RegistryAuth::Token { user, password } => Some((user, password)),
        }
    }
    /// The token server, when started with token auth.
    pub fn token_server(&self) -> Option<&TokenServer> {
        self.token.as_ref()
    }
    /// A client without proxy that trusts [`Self::ca_pem`]; no credentials attached.
    pub fn client(&self) -> reqwest::Client {
        self.client.clone()
    }
    /// Storage root (`rootdirectory` of the filesystem driver).
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// The temp dir with config, log, certificates and storage.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
    /// The file holding a blob's bytes, to corrupt or truncate in tests.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let (alg, hex) = digest.split_once(':').unwrap_or_else(|| panic!("digest {digest:?} has no algorithm"));
        assert!(hex.len() > 2, "digest {digest:?} too short");
        self.root.join(format!("docker/registry/v2/blobs/{alg}/{}/{hex}/data", &hex[..2]))
    }
    /// The registry's log so far.
    pub fn log(&self) -> String {
        self.daemon.log()
    }
    /// Stops the registry now (e.g. to test an unreachable registry); storage stays until drop.
    pub fn stop(&mut self) {
        self.daemon.stop();
    }

    /// A bearer token for `scope` (e.g. `repository:busybox:pull`) from the token server, using the
    /// configured credentials. Panics when the registry has no token auth.
    pub async fn token(&self, scope: &str) -> String {
        let ts = self.token.as_ref().expect("registry was not started with token auth");
        let (user, password) = self.credentials().expect("token auth has credentials");
        let resp = self
            .client
            .get(ts.realm())
            .query(&[("service", SERVICE), ("scope", scope)])
            .basic_auth(user, Some(password))
            .send()
            .await
            .expect("token request");
        let status = resp.status();
        let body: serde_json::Value = resp.json().await.expect("token response json");
        assert!(status.is_success(), "token server answered {status}: {body}");
        body["token"].as_str().expect("token in response").to_owned()
    }

    async fn authorized(&self, rb: RequestBuilder, repo: &str) -> RequestBuilder {
        match &self.auth {
            RegistryAuth::None => rb,
            RegistryAuth::Basic { user, password } => rb.basic_auth(user, Some(password)),
            RegistryAuth::Token { .. } => {
                let cached = self.push_tokens.lock().unwrap_or_else(|e| e.into_inner()).get(repo).cloned();
                let t = match cached {
                    Some(t) => t,
                    None => {
                        let t = self.token(&format!("repository:{repo}:pull,push")).await;
                        self.push_tokens.lock().unwrap_or_else(|e| e.into_inner()).insert(repo.into(), t.clone());
                        t
                    }
                };
                rb.bearer_auth(t)
            }
        }
    }

    /// Uploads a blob unless the repository already has it (POST, then PUT with the digest).
    pub async fn push_blob(&self, repo: &str, digest: &str, data: Bytes) {
        let head = self.authorized(self.client.head(self.url(&format!("/v2/{repo}/blobs/{digest}"))), repo).await;
        if head.send().await.map(|r| r.status() == StatusCode::OK).unwrap_or(false) {
            return;
        }
        let post = self.authorized(self.client.post(self.url(&format!("/v2/{repo}/blobs/uploads/"))), repo).await;
        let resp = post.send().await.unwrap_or_else(|e| panic!("start upload to {repo}: {e}"));
        let status = resp.status();
        let location = resp.headers().get("location").and_then(|l| l.to_str().ok()).map(str::to_owned);
        let Some(location) = location.filter(|_| status == StatusCode::ACCEPTED) else {
            panic!("start upload to {repo}: {status}: {}", resp.text().await.unwrap_or_default());
        };
        let location = if location.starts_with('/') { self.url(&location) } else { location };
        let sep = if location.contains('?') { '&' } else { '?' };
        let put = self
            .client
            .put(format!("{location}{sep}digest={digest}"))
            .header("content-type", "application/octet-stream")
            .body(data);
        let resp = self.authorized(put, repo).await.send().await.unwrap_or_else(|e| panic!("upload {digest}: {e}"));
        let status = resp.status();
        assert!(
            status == StatusCode::CREATED,
            "upload {digest} to {repo}: {status}: {}",
            resp.text().await.unwrap_or_default()
        );
    }

    /// PUTs a manifest (by tag or digest) and checks the digest the registry computed.
    pub async fn push_manifest(&self, repo: &str, reference: &str, media_type: &str, body: Bytes) -> String {
        let digest = crate::images::sha256_digest(&body);
        let put = self
            .client
            .put(self.url(&format!("/v2/{repo}/manifests/{reference}")))
            .header("content-type", media_type)
            .body(body);
        let resp = self.authorized(put, repo).await.send().await.unwrap_or_else(|e| panic!("put manifest: {e}"));
        let status = resp.status();
        let got = resp.headers().get("docker-content-digest").and_then(|d| d.to_str().ok()).map(str::to_owned);
        assert!(
            status == StatusCode::CREATED,
            "put manifest {repo}:{reference}: {status}: {}",
            resp.text().await.unwrap_or_default()
        );
        assert_eq!(got.as_deref(), Some(digest.as_str()), "registry computed another manifest digest");
        digest
    }

    /// Pushes layers, config and manifest; tags it `tag` (`None`: by digest only).
    pub async fn push_image_ref(&self, repo: &str, tag: Option<&str>, image: &Image) {
        for l in &image.layers {
            self.push_blob(repo, &l.digest, l.blob.clone()).await;
        }
        self.push_blob(repo, &image.config_digest, image.config_json.clone()).await;
        let reference = tag.unwrap_or(&image.manifest_digest);
        self.push_manifest(repo, reference, image.media_type(), image.manifest_json.clone()).await;
    }

    /// Pushes an image as `repo:tag`.
    pub async fn push_image(&self, repo: &str, tag: &str, image: &Image) -> PushedImage {
        self.push_image_ref(repo, Some(tag), image).await;
        PushedImage {
            repo: repo.into(),
            tag: tag.into(),
            reference: self.reference(&format!("{repo}:{tag}")),
            image: image.clone(),
        }
    }

    /// Pushes every image of the index by digest, then the index as `repo:tag`.
    pub async fn push_index(&self, repo: &str, tag: &str, index: &Index) -> PushedIndex {
        for img in &index.images {
            self.push_image_ref(repo, None, img).await;
        }
        self.push_manifest(repo, tag, index.media_type(), index.json.clone()).await;
        PushedIndex {
            repo: repo.into(),
            tag: tag.into(),
            reference: self.reference(&format!("{repo}:{tag}")),
            index: index.clone(),
        }
    }
}

/// An image pushed to a registry.
#[derive(Clone, Debug)]
pub struct PushedImage {
    pub repo: String,
    pub tag: String,
    /// `127.0.0.1:PORT/repo:tag`
    pub reference: String,
    /// Everything about it: manifest/config digests, layers, diff_ids, platform.
    pub image: Image,
}

impl PushedImage {
    pub fn digest(&self) -> &str {
        &self.image.manifest_digest
    }
    /// `127.0.0.1:PORT/repo@sha256:…`
    pub fn reference_by_digest(&self) -> String {
        let host = self.reference.split('/').next().unwrap_or_default();
        format!("{host}/{}@{}", self.repo, self.image.manifest_digest)
    }
}

/// An index (or manifest list) pushed to a registry, with its images.
#[derive(Clone, Debug)]
pub struct PushedIndex {
    pub repo: String,
    pub tag: String,
    pub reference: String,
    pub index: Index,
}

impl PushedIndex {
    pub fn digest(&self) -> &str {
        &self.index.digest
    }
}
