//! The registry client: OCI distribution (Docker Registry v2) over reqwest — endpoints and mirrors,
//! HTTPS/HTTP choice, authentication, retries, and resumable blob downloads into the store.
//!
//! Why reqwest directly rather than `oci-client`: a pull here needs, per request, things that
//! client keeps to itself — Range requests continuing from the bytes already in an ingest file,
//! streaming straight into our verifying ingest, an ordered list of mirrors (with a path prefix
//! and their own TLS settings) tried before the host, the HTTPS-then-HTTP fallback Docker applies
//! to insecure and loopback registries, and CRI's four credential shapes. The protocol itself is
//! small: `GET /v2/`, `GET /v2/<name>/manifests/<ref>`, `GET /v2/<name>/blobs/<digest>`, and the
//! token flow below.
//!
//! Endpoints, in order: each configured mirror (`http://127.0.0.1:5000` serves
//! `docker.io/library/busybox` as `library/busybox`), then the host (`docker.io` is reached at
//! `registry-1.docker.io`). A host is HTTPS, trusting the system roots plus its `ca_files`; an
//! `insecure` host is tried over HTTPS without verification and then plain HTTP; a loopback host
//! (127.0.0.0/8, ::1, localhost) over HTTPS and then plain HTTP, as Docker does.
//!
//! Auth: each endpoint is pinged (`GET /v2/`); a `401` challenge says Basic or Bearer. Basic sends
//! the credentials with every request. Bearer asks the challenge's realm for a token
//! (`?service=…&scope=repository:<name>:pull`, with basic credentials if any, or a POSTed refresh
//! token when CRI gives an identity token) and caches it until it expires; a ready
//! `registry_token` is sent as is. A `401` after authenticating, or a `403`, is `Unauthorized`.
//!
//! Failures: connection errors, timeouts, `429` and `5xx` are retried with exponential backoff and
//! end as `RegistryUnavailable`; a mirror that fails hands over to the next endpoint.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use reqwest::StatusCode;
use reqwest::header::{
    ACCEPT, AUTHORIZATION, CONTENT_RANGE, CONTENT_TYPE, HeaderMap, HeaderValue, RANGE, WWW_AUTHENTICATE,
};
use tracing::{debug, warn};

use crate::content::Ingest;
use crate::manifest::{MANIFEST_ACCEPT, MANIFEST_MAX};
use crate::reference::is_loopback_host;
use crate::{Credentials, ImageError, RegistryHost};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const READ_TIMEOUT: Duration = Duration::from_secs(30);
const SMALL_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Retries of one request after a transient failure.
const RETRIES: u32 = 3;
/// Resumptions of one blob download after its stream broke.
const BLOB_RESUMES: u32 = 5;
const BACKOFF_START: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(3);
const USER_AGENT: &str = concat!("berth/", env!("CARGO_PKG_VERSION"));

/// HTTP clients, chosen schemes and tokens shared by all pulls.
pub(crate) struct Registries {
    hosts: BTreeMap<String, RegistryHost>,
    clients: Mutex<HashMap<(bool, Vec<PathBuf>), reqwest::Client>>,
    /// Candidate list → the base URL that answered.
    bases: Mutex<HashMap<String, String>>,
    tokens: Mutex<HashMap<String, (String, Instant)>>,
}

/// An error status from a registry, as the `source` of `RegistryUnavailable`.
#[derive(Debug, thiserror::Error)]
#[error("{url} answered {status}: {message}")]
pub(crate) struct StatusError {
    url: String,
    status: StatusCode,
    message: String,
}

impl Registries {
    pub(crate) fn new(hosts: BTreeMap<String, RegistryHost>) -> Self {
        Registries { hosts, clients: Mutex::default(), bases: Mutex::default(), tokens: Mutex::default() }
    }

    fn client(&self, insecure: bool, ca_files: &[PathBuf]) -> Result<reqwest::Client, ImageError> {
        let key = (insecure, ca_files.to_vec());
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(client) = clients.get(&key) {
            return Ok(client.clone());
        }
        let mut builder = reqwest::Client::builder()
            .user_agent(USER_AGENT)
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .tls_built_in_native_certs(true)
            .danger_accept_invalid_certs(insecure);
        for path in ca_files {
            let pem = std::fs::read(path).map_err(|source| ImageError::Io { path: path.clone(), source })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                ImageError::InvalidArgument(format!("CA file {} is not PEM certificates: {e}", path.display()))
            })?;
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let client = builder.build().map_err(|e| ImageError::Internal(format!("building the HTTP client: {e}")))?;
        clients.insert(key, client.clone());
        Ok(client)
    }

    /// A session for pulling from one repository, with its endpoints in order.
    pub(crate) fn repository(
        &self,
        registry: &str,
        repository: &str,
        credentials: Option<Credentials>,
    ) -> Result<Repository<'_>, ImageError> {
        let host_config = self.hosts.get(registry).cloned().unwrap_or_default();
        let mut endpoints = Vec::new();
        for mirror in &host_config.mirrors {
            endpoints.push(self.endpoint_for(mirror, None, true)?);
        }
        // The host's own settings apply even where it is reached under another name (docker.io).
        let host = if registry == crate::reference::DEFAULT_REGISTRY { "registry-1.docker.io" } else { registry };
        endpoints.push(self.endpoint_for(host, Some(&host_config), false)?);
        Ok(Repository {
            registries: self,
            registry: registry.to_string(),
            repository: repository.to_string(),
            credentials: credentials.map(Auth::from_credentials).unwrap_or_default(),
            endpoints,
            preferred: AtomicUsize::new(0),
        })
    }

    /// An endpoint from `http[s]://host[:port][/prefix]` or a bare `host[:port]`; TLS settings come
    /// from `config`, else from the registries entry for its host.
    fn endpoint_for(&self, spec: &str, config: Option<&RegistryHost>, mirror: bool) -> Result<Endpoint, ImageError> {
        let invalid = |why: String| ImageError::InvalidArgument(format!("invalid registry endpoint {spec:?}: {why}"));
        let (scheme, rest) = match spec.split_once("://") {
            Some((scheme @ ("http" | "https"), rest)) => (Some(scheme), rest),
            Some((other, _)) => return Err(invalid(format!("unsupported scheme {other:?}"))),
            None => (None, spec),
        };
        let url = url::Url::parse(&format!("https://{rest}")).map_err(|e| invalid(e.to_string()))?;
        let host = url.host_str().ok_or_else(|| invalid("no host".into()))?;
        let host_port = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_string(),
        };
        let config = config.cloned().or_else(|| self.hosts.get(&host_port).cloned()).unwrap_or_default();
        let path = url.path().trim_end_matches('/').trim_end_matches("/v2").to_string();
        let candidates = match scheme {
            Some(scheme) => vec![format!("{scheme}://{host_port}{path}")],
            None if config.insecure || is_loopback_host(&host_port) => {
                vec![format!("https://{host_port}{path}"), format!("http://{host_port}{path}")]
            }
            None => vec![format!("https://{host_port}{path}")],
        };
        let client = self.client(config.insecure, &config.ca_files)?;
        Ok(Endpoint::new(host_port, candidates, client, mirror))
    }
}

/// One place a repository can be fetched from.
struct Endpoint {
    host: String,
    candidates: Vec<String>,
    client: reqwest::Client,
    mirror: bool,
    challenge: Mutex<Option<Challenge>>,
}

impl Endpoint {
    fn new(host: String, candidates: Vec<String>, client: reqwest::Client, mirror: bool) -> Self {
        Endpoint { host, candidates, client, mirror, challenge: Mutex::new(None) }
    }
}

/// Credentials in the shape requests need.
#[derive(Debug, Clone, Default)]
struct Auth {
    basic: Option<(String, String)>,
    refresh_token: Option<String>,
    registry_token: Option<String>,
}

impl Auth {
    fn from_credentials(c: Credentials) -> Self {
        let non_empty = |s: String| (!s.is_empty()).then_some(s);
        let basic = if !c.username.is_empty() {
            Some((c.username.clone(), c.password.clone()))
        } else if !c.auth.is_empty() {
            base64::engine::general_purpose::STANDARD
                .decode(c.auth.trim())
                .ok()
                .and_then(|raw| String::from_utf8(raw).ok())
                .and_then(|s| s.split_once(':').map(|(u, p)| (u.to_string(), p.to_string())))
        } else {
            None
        };
        Auth { basic, refresh_token: non_empty(c.identity_token), registry_token: non_empty(c.registry_token) }
    }

    fn is_empty(&self) -> bool {
        self.basic.is_none() && self.refresh_token.is_none() && self.registry_token.is_none()
    }
}

/// A parsed `WWW-Authenticate` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Challenge {
    Basic,
    Bearer { realm: String, service: Option<String>, scope: Option<String> },
}

impl Challenge {
    /// Parses `Bearer realm="…",service="…",scope="…"` or `Basic realm="…"`.
    pub(crate) fn parse(header: &str) -> Option<Self> {
        let header = header.trim();
        let (scheme, rest) = header.split_once(char::is_whitespace).unwrap_or((header, ""));
        let params = parse_params(rest);
        match scheme.to_ascii_lowercase().as_str() {
            "basic" => Some(Challenge::Basic),
            "bearer" => Some(Challenge::Bearer {
                realm: params.get("realm")?.clone(),
                service: params.get("service").cloned(),
                scope: params.get("scope").cloned(),
            }),
            _ => None,
        }
    }
}

/// `key="value", key2=value2` with quoted strings that may hold commas.
fn parse_params(s: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace() || *c == ',') {
            chars.next();
        }
        let key: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=' && *c != ',')).collect();
        if key.is_empty() {
            break;
        }
        if chars.next() != Some('=') {
            continue;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            value = std::iter::from_fn(|| chars.next_if(|c| *c != ',')).collect::<String>().trim().to_string();
        }
        out.insert(key.trim().to_ascii_lowercase(), value);
    }
    out
}

/// Pulling from one repository: its endpoints, credentials, and the endpoint that worked.
pub(crate) struct Repository<'a> {
    registries: &'a Registries,
    registry: String,
    repository: String,
    credentials: Auth,
    endpoints: Vec<Endpoint>,
    preferred: AtomicUsize,
}

/// A fetched manifest document.
pub(crate) struct FetchedManifest {
    pub bytes: Vec<u8>,
    pub content_type: String,
}

fn transient(e: &reqwest::Error) -> bool {
    !(e.is_builder() || e.is_redirect())
}

fn backoff(attempt: u32) -> Duration {
    BACKOFF_START.saturating_mul(1 << attempt.min(8)).min(BACKOFF_MAX)
}

/// `errors[0].message` of a distribution error body, else the status text.
async fn error_message(resp: reqwest::Response) -> String {
    let status = resp.status();
    let body = resp.text().await.unwrap_or_default();
    serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| {
            let e = v.get("errors")?.get(0)?;
            let message = e.get("message").and_then(|m| m.as_str()).unwrap_or_default();
            let code = e.get("code").and_then(|m| m.as_str()).unwrap_or_default();
            Some(if code.is_empty() { message.to_string() } else { format!("{code}: {message}") })
        })
        .or_else(|| (!body.trim().is_empty() && body.len() < 200).then(|| body.trim().to_string()))
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_string())
}

impl Repository<'_> {
    fn unavailable(&self, source: impl std::error::Error + Send + Sync + 'static) -> ImageError {
        ImageError::RegistryUnavailable { registry: self.registry.clone(), source: Box::new(source) }
    }

    fn unauthorized(&self, reason: String) -> ImageError {
        ImageError::Unauthorized { registry: self.registry.clone(), repository: self.repository.clone(), reason }
    }

    fn scope(&self) -> String {
        format!("repository:{}:pull", self.repository)
    }

    /// The base URL of `endpoint`: the first candidate that answers `GET /v2/` at all. Learns the
    /// auth challenge on the way.
    async fn base(&self, endpoint: &Endpoint) -> Result<String, ImageError> {
        let key = endpoint.candidates.join(" ");
        if let Some(base) = self.registries.bases.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(base.clone());
        }
        let mut last_error = None;
        for attempt in 0..=RETRIES {
            if attempt > 0 {
                tokio::time::sleep(backoff(attempt - 1)).await;
            }
            for base in &endpoint.candidates {
                let url = format!("{base}/v2/");
                match endpoint.client.get(&url).timeout(SMALL_REQUEST_TIMEOUT).send().await {
                    Ok(resp) => {
                        debug!(host = %endpoint.host, base, status = %resp.status(), "registry endpoint answered");
                        if resp.status() == StatusCode::UNAUTHORIZED {
                            let challenge = resp
                                .headers()
                                .get(WWW_AUTHENTICATE)
                                .and_then(|h| h.to_str().ok())
                                .and_then(Challenge::parse);
                            *endpoint.challenge.lock().unwrap_or_else(|e| e.into_inner()) = challenge;
                        }
                        self.registries.bases.lock().unwrap_or_else(|e| e.into_inner()).insert(key, base.clone());
                        return Ok(base.clone());
                    }
                    Err(e) => {
                        debug!(host = %endpoint.host, base, error = %e, "registry endpoint did not answer");
                        let retry = transient(&e);
                        last_error = Some(e);
                        if !retry {
                            break;
                        }
                    }
                }
            }
        }
        match last_error {
            Some(e) => Err(self.unavailable(e)),
            None => Err(ImageError::Internal("registry endpoint has no candidates".into())),
        }
    }

    /// The Authorization header for `endpoint` as things stand, fetching a token if needed.
    async fn authorization(&self, endpoint: &Endpoint) -> Result<Option<String>, ImageError> {
        if let Some(token) = &self.credentials.registry_token {
            return Ok(Some(format!("Bearer {token}")));
        }
        let challenge = endpoint.challenge.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match challenge {
            None => Ok(None),
            Some(Challenge::Basic) => Ok(self.credentials.basic.as_ref().map(|(user, password)| {
                format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
            })),
            Some(Challenge::Bearer { realm, service, scope }) => {
                let scope = scope.unwrap_or_else(|| self.scope());
                self.token(endpoint, &realm, service.as_deref(), &scope).await.map(|t| Some(format!("Bearer {t}")))
            }
        }
    }

    /// A bearer token for `scope` from `realm`, cached until it expires.
    async fn token(
        &self,
        endpoint: &Endpoint,
        realm: &str,
        service: Option<&str>,
        scope: &str,
    ) -> Result<String, ImageError> {
        let user = self.credentials.basic.as_ref().map(|(u, _)| u.as_str()).unwrap_or_default();
        let key = format!("{realm}\n{}\n{scope}\n{user}", service.unwrap_or_default());
        if let Some((token, expires)) = self.registries.tokens.lock().unwrap_or_else(|e| e.into_inner()).get(&key)
            && *expires > Instant::now()
        {
            return Ok(token.clone());
        }
        let mut last_error = None;
        for attempt in 0..=RETRIES {
            if attempt > 0 {
                tokio::time::sleep(backoff(attempt - 1)).await;
            }
            let request = if let Some(refresh) = &self.credentials.refresh_token {
                let mut form = vec![
                    ("grant_type", "refresh_token"),
                    ("refresh_token", refresh.as_str()),
                    ("scope", scope),
                    ("client_id", "berth"),
                ];
                if let Some(service) = service {
                    form.push(("service", service));
                }
                endpoint.client.post(realm).form(&form)
            } else {
                let mut query = vec![("scope", scope)];
                if let Some(service) = service {
                    query.push(("service", service));
                }
                if !user.is_empty() {
                    query.push(("account", user));
                }
                let mut request = endpoint.client.get(realm).query(&query);
                if let Some((user, password)) = &self.credentials.basic {
                    request = request.basic_auth(user, Some(password));
                }
                request
            };
            let resp = match request.timeout(SMALL_REQUEST_TIMEOUT).send().await {
                Ok(resp) => resp,
                Err(e) if transient(&e) => {
                    last_error = Some(self.unavailable(e));
                    continue;
                }
                Err(e) => return Err(self.unavailable(e)),
            };
            let status = resp.status();
            if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                let message = error_message(resp).await;
                return Err(self.unauthorized(format!("token server refused the credentials: {message}")));
            }
            if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
                let message = error_message(resp).await;
                last_error = Some(self.unavailable(StatusError { url: realm.to_string(), status, message }));
                continue;
            }
            if !status.is_success() {
                let message = error_message(resp).await;
                return Err(self.unavailable(StatusError { url: realm.to_string(), status, message }));
            }
            let body: serde_json::Value =
                resp.json().await.map_err(|e| ImageError::Internal(format!("unreadable token from {realm}: {e}")))?;
            let token = body
                .get("token")
                .or_else(|| body.get("access_token"))
                .and_then(|t| t.as_str())
                .filter(|t| !t.is_empty())
                .ok_or_else(|| ImageError::Internal(format!("token server {realm} sent no token")))?
                .to_string();
            let lifetime = body.get("expires_in").and_then(|e| e.as_u64()).unwrap_or(60).max(10);
            // Renew a little early.
            let expires = Instant::now() + Duration::from_secs(lifetime - 5);
            self.registries.tokens.lock().unwrap_or_else(|e| e.into_inner()).insert(key, (token.clone(), expires));
            return Ok(token);
        }
        Err(last_error.unwrap_or_else(|| ImageError::Internal("token fetch never tried".into())))
    }

    /// GET `path` on `endpoint` with auth and retries; returns any response that is not an auth
    /// failure or a transient error, for the caller to read.
    async fn get(&self, endpoint: &Endpoint, path: &str, headers: HeaderMap) -> Result<reqwest::Response, ImageError> {
        let base = self.base(endpoint).await?;
        let url = format!("{base}{path}");
        let mut reauthenticated = false;
        let mut attempt = 0;
        loop {
            let mut request = endpoint.client.get(&url).headers(headers.clone());
            if let Some(auth) = self.authorization(endpoint).await? {
                request = request.header(AUTHORIZATION, auth);
            }
            let failure = match request.send().await {
                Err(e) if transient(&e) => self.unavailable(e),
                Err(e) => return Err(self.unavailable(e)),
                Ok(resp) => match resp.status() {
                    StatusCode::UNAUTHORIZED if !reauthenticated => {
                        let challenge = resp
                            .headers()
                            .get(WWW_AUTHENTICATE)
                            .and_then(|h| h.to_str().ok())
                            .and_then(Challenge::parse);
                        let message = error_message(resp).await;
                        match challenge {
                            Some(Challenge::Basic) if self.credentials.basic.is_none() => {
                                return Err(self.unauthorized(format!("{message} (no credentials given)")));
                            }
                            Some(challenge) => {
                                *endpoint.challenge.lock().unwrap_or_else(|e| e.into_inner()) = Some(challenge);
                                reauthenticated = true;
                                continue;
                            }
                            None => return Err(self.unauthorized(message)),
                        }
                    }
                    StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                        let mut message = error_message(resp).await;
                        if self.credentials.is_empty() {
                            message.push_str(" (no credentials given)");
                        }
                        return Err(self.unauthorized(message));
                    }
                    status if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() => {
                        let message = error_message(resp).await;
                        self.unavailable(StatusError { url: url.clone(), status, message })
                    }
                    _ => return Ok(resp),
                },
            };
            if attempt >= RETRIES {
                return Err(failure);
            }
            debug!(url, attempt, error = %failure, "retrying registry request");
            tokio::time::sleep(backoff(attempt)).await;
            attempt += 1;
        }
    }

    /// Endpoint indexes to try, the one that served the manifest first.
    fn order(&self) -> Vec<usize> {
        let preferred = self.preferred.load(Ordering::Relaxed);
        std::iter::once(preferred).chain((0..self.endpoints.len()).filter(|i| *i != preferred)).collect()
    }

    /// Picks the error to report when every endpoint failed: the host's own, unless it is
    /// merely unreachable and a mirror said something more specific.
    fn pick_error(errors: Vec<ImageError>) -> ImageError {
        let mut specific = None;
        let mut last = None;
        for e in errors {
            if specific.is_none() && !matches!(e, ImageError::RegistryUnavailable { .. }) {
                specific = Some(e);
            } else {
                last = Some(e);
            }
        }
        match (specific, last) {
            (Some(e), _) => e,
            (None, Some(e)) => e,
            (None, None) => ImageError::Internal("no registry endpoint to try".into()),
        }
    }

    /// Fetches the manifest or index `reference` (tag or digest).
    pub(crate) async fn manifest(&self, reference: &str) -> Result<FetchedManifest, ImageError> {
        let mut errors = Vec::new();
        for (i, endpoint) in self.endpoints.iter().enumerate() {
            match self.manifest_from(endpoint, reference).await {
                Ok(m) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    return Ok(m);
                }
                Err(e) => {
                    if endpoint.mirror {
                        warn!(mirror = %endpoint.host, reference, error = %e, "mirror failed; trying the next endpoint");
                    }
                    errors.push(e);
                }
            }
        }
        Err(Self::pick_error(errors))
    }

    async fn manifest_from(&self, endpoint: &Endpoint, reference: &str) -> Result<FetchedManifest, ImageError> {
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static(MANIFEST_ACCEPT));
        let path = format!("/v2/{}/manifests/{reference}", self.repository);
        let resp = self.get(endpoint, &path, headers).await?;
        let status = resp.status();
        if status == StatusCode::NOT_FOUND {
            let message = error_message(resp).await;
            // A digest follows `@`, a tag `:`.
            let separator = if reference.contains(':') { '@' } else { ':' };
            return Err(ImageError::InvalidArgument(format!(
                "image {}/{}{separator}{reference} not found in the registry ({message})",
                self.registry, self.repository
            )));
        }
        if !status.is_success() {
            let message = error_message(resp).await;
            return Err(self.unavailable(StatusError { url: path, status, message }));
        }
        if resp.content_length().is_some_and(|n| n > MANIFEST_MAX) {
            return Err(ImageError::InvalidArgument(format!(
                "manifest {reference} is larger than {MANIFEST_MAX} bytes"
            )));
        }
        let content_type =
            resp.headers().get(CONTENT_TYPE).and_then(|h| h.to_str().ok()).unwrap_or_default().to_string();
        let bytes = resp.bytes().await.map_err(|e| self.unavailable(e))?;
        if bytes.len() as u64 > MANIFEST_MAX {
            return Err(ImageError::InvalidArgument(format!(
                "manifest {reference} is larger than {MANIFEST_MAX} bytes"
            )));
        }
        Ok(FetchedManifest { bytes: bytes.to_vec(), content_type })
    }

    /// Fetches a small blob (a manifest by digest goes through [`Self::manifest`]; this is for
    /// the config) into memory.
    pub(crate) async fn small_blob(&self, digest: &str, size: u64) -> Result<Vec<u8>, ImageError> {
        if size > MANIFEST_MAX * 4 {
            return Err(ImageError::InvalidArgument(format!("config {digest} is implausibly large ({size} bytes)")));
        }
        let mut errors = Vec::new();
        for i in self.order() {
            let endpoint = &self.endpoints[i];
            let path = format!("/v2/{}/blobs/{digest}", self.repository);
            let result = async {
                let resp = self.get(endpoint, &path, HeaderMap::new()).await?;
                let status = resp.status();
                if !status.is_success() {
                    let message = error_message(resp).await;
                    return Err(self.unavailable(StatusError { url: path.clone(), status, message }));
                }
                resp.bytes().await.map(|b| b.to_vec()).map_err(|e| self.unavailable(e))
            }
            .await;
            match result {
                Ok(bytes) => return Ok(bytes),
                Err(e) => errors.push(e),
            }
        }
        Err(Self::pick_error(errors))
    }

    /// Downloads blob `digest` into `ingest`, continuing from what it already holds; `progress`
    /// gets the bytes present after each chunk. The caller commits (verifies) the ingest.
    pub(crate) async fn blob(
        &self,
        digest: &str,
        size: u64,
        ingest: &mut Ingest,
        progress: &(dyn Fn(u64) + Send + Sync),
    ) -> Result<(), ImageError> {
        let mut errors = Vec::new();
        for i in self.order() {
            match self.blob_from(&self.endpoints[i], digest, size, ingest, progress).await {
                Ok(()) => return Ok(()),
                Err(e @ (ImageError::DigestMismatch { .. } | ImageError::NoSpace { .. } | ImageError::Io { .. })) => {
                    return Err(e);
                }
                Err(e) => {
                    debug!(endpoint = %self.endpoints[i].host, digest, error = %e, "blob download failed here");
                    errors.push(e);
                }
            }
        }
        Err(Self::pick_error(errors))
    }

    async fn blob_from(
        &self,
        endpoint: &Endpoint,
        digest: &str,
        size: u64,
        ingest: &mut Ingest,
        progress: &(dyn Fn(u64) + Send + Sync),
    ) -> Result<(), ImageError> {
        let path = format!("/v2/{}/blobs/{digest}", self.repository);
        let mut resumes = 0;
        loop {
            let offset = ingest.offset();
            if offset >= size {
                return Ok(());
            }
            let mut headers = HeaderMap::new();
            if offset > 0 {
                let range = HeaderValue::from_str(&format!("bytes={offset}-")).expect("ascii range header");
                headers.insert(RANGE, range);
            }
            let mut resp = self.get(endpoint, &path, headers).await?;
            match resp.status() {
                StatusCode::OK if offset > 0 => {
                    debug!(digest, offset, "registry ignored the range; starting over");
                    ingest.reset().await?;
                }
                StatusCode::OK => {}
                StatusCode::PARTIAL_CONTENT => {
                    let start = resp
                        .headers()
                        .get(CONTENT_RANGE)
                        .and_then(|h| h.to_str().ok())
                        .and_then(|h| h.strip_prefix("bytes "))
                        .and_then(|h| h.split('-').next())
                        .and_then(|s| s.parse::<u64>().ok());
                    if start != Some(offset) {
                        ingest.reset().await?;
                        continue;
                    }
                    debug!(digest, offset, "resuming blob download");
                }
                StatusCode::RANGE_NOT_SATISFIABLE => {
                    ingest.reset().await?;
                    continue;
                }
                StatusCode::NOT_FOUND => {
                    let message = error_message(resp).await;
                    return Err(ImageError::InvalidArgument(format!(
                        "blob {digest} not found in {}/{} ({message})",
                        self.registry, self.repository
                    )));
                }
                status => {
                    let message = error_message(resp).await;
                    return Err(self.unavailable(StatusError { url: path, status, message }));
                }
            }
            let broken = loop {
                match resp.chunk().await {
                    Ok(Some(chunk)) => {
                        ingest.write(&chunk).await?;
                        progress(ingest.offset());
                    }
                    Ok(None) => break None,
                    Err(e) => break Some(e),
                }
            };
            match broken {
                None if ingest.offset() >= size => return Ok(()),
                None => debug!(digest, got = ingest.offset(), size, "blob stream ended early"),
                Some(e) => debug!(digest, got = ingest.offset(), error = %e, "blob stream broke"),
            }
            if resumes >= BLOB_RESUMES {
                return Err(self.unavailable(StatusError {
                    url: path,
                    status: StatusCode::PARTIAL_CONTENT,
                    message: format!("download kept breaking off after {} of {size} bytes", ingest.offset()),
                }));
            }
            tokio::time::sleep(backoff(resumes)).await;
            resumes += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenges_are_parsed_with_quoted_commas() {
        let c = Challenge::parse(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull,push""#,
        );
        assert_eq!(
            c,
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/busybox:pull,push".into()),
            })
        );
        assert_eq!(Challenge::parse(r#"Basic realm="Registry Realm""#), Some(Challenge::Basic));
        assert_eq!(Challenge::parse("Bearer service=x"), None);
        assert_eq!(Challenge::parse("Negotiate"), None);
    }

    #[test]
    fn credentials_come_from_username_or_auth_field() {
        let auth =
            Auth::from_credentials(Credentials { username: "u".into(), password: "p".into(), ..Default::default() });
        assert_eq!(auth.basic, Some(("u".into(), "p".into())));
        let encoded = base64::engine::general_purpose::STANDARD.encode("alice:s:ecret");
        let auth = Auth::from_credentials(Credentials { auth: encoded, ..Default::default() });
        assert_eq!(auth.basic, Some(("alice".into(), "s:ecret".into())));
        let auth = Auth::from_credentials(Credentials { registry_token: "t".into(), ..Default::default() });
        assert_eq!(auth.registry_token.as_deref(), Some("t"));
        assert!(Auth::from_credentials(Credentials::default()).is_empty());
    }

    #[test]
    fn endpoints_put_mirrors_first_and_fall_back_to_http_only_where_allowed() {
        let mut hosts = BTreeMap::new();
        hosts.insert(
            "docker.io".to_string(),
            RegistryHost {
                mirrors: vec!["http://127.0.0.1:5000".into(), "mirror.example.com/v2/".into()],
                ..Default::default()
            },
        );
        hosts.insert("internal.example:5000".to_string(), RegistryHost { insecure: true, ..Default::default() });
        let registries = Registries::new(hosts);
        let repo = registries.repository("docker.io", "library/busybox", None).unwrap();
        let bases: Vec<Vec<String>> = repo.endpoints.iter().map(|e| e.candidates.clone()).collect();
        assert_eq!(
            bases,
            vec![
                vec!["http://127.0.0.1:5000".to_string()],
                vec!["https://mirror.example.com".to_string()],
                vec!["https://registry-1.docker.io".to_string()],
            ]
        );
        let repo = registries.repository("internal.example:5000", "app", None).unwrap();
        assert_eq!(repo.endpoints[0].candidates, vec!["https://internal.example:5000", "http://internal.example:5000"]);
        let repo = registries.repository("127.0.0.1:5000", "app", None).unwrap();
        assert_eq!(repo.endpoints[0].candidates, vec!["https://127.0.0.1:5000", "http://127.0.0.1:5000"]);
        let repo = registries.repository("quay.io", "app", None).unwrap();
        assert_eq!(repo.endpoints[0].candidates, vec!["https://quay.io"]);
    }

    #[tokio::test]
    async fn unreachable_registry_is_unavailable() {
        // A loopback port nobody listens on (bound, then closed).
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let registries = Registries::new(BTreeMap::new());
        let host = format!("127.0.0.1:{port}");
        let repo = registries.repository(&host, "app", None).unwrap();
        let err = repo.manifest("latest").await.err().unwrap();
        assert!(matches!(err, ImageError::RegistryUnavailable { ref registry, .. } if *registry == host), "{err:?}");
    }
}
