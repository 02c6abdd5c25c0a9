//! Our own Docker registry token server (the "token" auth of distribution): checks basic
//! credentials and issues ES256 JWTs that the registry verifies against `rootcertbundle`.
//!
//! It runs on its own thread with its own tokio runtime, so it serves while a test blocks and
//! works from sync code too. Protocol: `GET /token?service=S&scope=repository:NAME:pull,push`
//! (scope may repeat) with optional `Authorization: Basic`, or `POST /token` with the OAuth2
//! password grant (`grant_type=password&username=…&password=…&service=…&scope=…`). Right credentials get every action
//! asked for; no credentials get `pull` on the public repositories only (Docker Hub's anonymous
//! flow); wrong credentials get 401.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use rcgen::{CertificateParams, DnType, KeyPair, PublicKeyData};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
use serde_json::json;
use sha2::{Digest, Sha256};

/// The `service` the registry is configured with; the token's `aud`.
pub const SERVICE: &str = "berth-testenv-registry";
/// The token's `iss`.
pub const ISSUER: &str = "berth-testenv-token-server";
/// How long issued tokens are valid.
pub const TOKEN_TTL: Duration = Duration::from_secs(3600);

/// Who may get which token.
#[derive(Clone, Debug)]
pub struct TokenPolicy {
    pub user: String,
    pub password: String,
    /// Repositories (exact names, or prefixes ending in `/`) anonymous clients may pull.
    pub public_repos: Vec<String>,
}

struct Signer {
    policy: TokenPolicy,
    key: EcdsaKeyPair,
    kid: String,
    rng: SystemRandom,
    issued: AtomicU64,
    refused: AtomicU64,
}

/// A running token server; stops on drop.
pub struct TokenServer {
    realm: String,
    root_cert_pem: String,
    signer: Arc<Signer>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TokenServer {
    pub fn start(policy: TokenPolicy) -> TokenServer {
        let key = KeyPair::generate().expect("generate token signing key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("token cert params");
        params.distinguished_name.push(DnType::CommonName, ISSUER);
        let cert = params.self_signed(&key).expect("self-sign token cert");
        let kid = libtrust_key_id(&key.subject_public_key_info());
        let rng = SystemRandom::new();
        let signing =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &key.serialize_der(), &rng).expect("load key");
        let signer =
            Arc::new(Signer { policy, key: signing, kid, rng, issued: AtomicU64::new(0), refused: AtomicU64::new(0) });

        // Bound here so the port is known before the thread runs and cannot be taken meanwhile.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind token server");
        listener.set_nonblocking(true).expect("nonblocking listener");
        let addr = listener.local_addr().expect("token server addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let app = axum::Router::new()
            .route("/token", axum::routing::get(token_get).post(token_post))
            .with_state(signer.clone());
        let thread = std::thread::Builder::new()
            .name("berth-testenv-token".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("token runtime");
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                    axum::serve(listener, app)
                        .with_graceful_shutdown(async move {
                            let _ = rx.await;
                        })
                        .await
                        .expect("token server");
                });
            })
            .expect("spawn token server thread");
        TokenServer {
            realm: format!("http://{addr}/token"),
            root_cert_pem: cert.pem(),
            signer,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT/token`
    pub fn realm(&self) -> &str {
        &self.realm
    }
    /// The self-signed certificate of the signing key: the registry's `rootcertbundle`.
    pub fn root_cert_pem(&self) -> &str {
        &self.root_cert_pem
    }
    /// The `kid` put in token headers.
    pub fn key_id(&self) -> &str {
        &self.signer.kid
    }
    /// Tokens issued so far (anonymous ones included).
    pub fn issued(&self) -> u64 {
        self.signer.issued.load(Ordering::Relaxed)
    }
    /// Requests refused for wrong credentials.
    pub fn refused(&self) -> u64 {
        self.signer.refused.load(Ordering::Relaxed)
    }
    /// Signs a token directly (no HTTP), e.g. for tests that need an expired or foreign one.
    pub fn sign(&self, subject: &str, access: &[(String, Vec<String>)], ttl: Duration) -> String {
        self.signer.sign(subject, access, ttl)
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// distribution 2.8 finds the verification key by `kid`: libtrust's key ID, i.e. base32 of the
/// first 240 bits of sha256(DER SubjectPublicKeyInfo), in groups of 4 joined by ':'.
pub fn libtrust_key_id(spki_der: &[u8]) -> String {
    let hash = Sha256::digest(spki_der);
    let b32 = base32(&hash[..30]);
    b32.as_bytes().chunks(4).map(|c| String::from_utf8_lossy(c).into_owned()).collect::<Vec<_>>().join(":")
}

/// RFC 4648 base32, standard alphabet, no padding (30 bytes give exactly 48 chars).
fn base32(data: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::new();
    let (mut buf, mut bits) = (0u32, 0u32);
    for &b in data {
        buf = (buf << 8) | b as u32;
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(ALPHABET[((buf >> bits) & 31) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((buf << (5 - bits)) & 31) as usize] as char);
    }
    out
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default()
}

impl Signer {
    fn sign(&self, subject: &str, access: &[(String, Vec<String>)], ttl: Duration) -> String {
        let n = self.issued.fetch_add(1, Ordering::Relaxed);
        let t = now();
        let header = json!({"typ": "JWT", "alg": "ES256", "kid": self.kid});
        let access: Vec<_> = access
            .iter()
            .map(|(name, actions)| json!({"type": "repository", "name": name, "actions": actions}))
            .collect();
        let claims = json!({
            "iss": ISSUER,
            "sub": subject,
            "aud": SERVICE,
            "exp": t + ttl.as_secs(),
            // A little slack for clock granularity between us and the registry.
            "nbf": t.saturating_sub(5),
            "iat": t,
            "jti": format!("berth-testenv-{t}-{n}"),
            "access": access,
        });
        let enc = |v: &serde_json::Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).expect("jwt json"));
        let input = format!("{}.{}", enc(&header), enc(&claims));
        let sig = self.key.sign(&self.rng, input.as_bytes()).expect("sign jwt");
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
    }

    fn is_public(&self, repo: &str) -> bool {
        self.policy.public_repos.iter().any(|p| if p.ends_with('/') { repo.starts_with(p.as_str()) } else { p == repo })
    }
}

fn unauthorized(msg: &str) -> Response {
    let body = json!({"errors": [{"code": "UNAUTHORIZED", "message": msg}]});
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Basic realm=\"berth-testenv\"")], axum::Json(body))
        .into_response()
}

/// The query (GET) or form (POST) fields a token request carries.
#[derive(Default)]
struct TokenRequest {
    scopes: Vec<String>,
    service: Option<String>,
    /// POST only: `grant_type=password` with `username`/`password`.
    grant_type: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

impl TokenRequest {
    fn parse(fields: &[u8]) -> TokenRequest {
        let mut r = TokenRequest::default();
        for (k, v) in url::form_urlencoded::parse(fields) {
            match &*k {
                "scope" => r.scopes.extend(v.split(' ').filter(|x| !x.is_empty()).map(str::to_owned)),
                "service" => r.service = Some(v.into_owned()),
                "grant_type" => r.grant_type = Some(v.into_owned()),
                "username" => r.username = Some(v.into_owned()),
                "password" => r.password = Some(v.into_owned()),
                _ => {}
            }
        }
        r
    }
}

/// `GET /token`: credentials in `Authorization: Basic` (the Docker token protocol).
async fn token_get(State(s): State<Arc<Signer>>, RawQuery(q): RawQuery, headers: HeaderMap) -> Response {
    let req = TokenRequest::parse(q.unwrap_or_default().as_bytes());
    let Some(auth) = headers.get(header::AUTHORIZATION) else { return issue(&s, req, None) };
    let basic = auth
        .to_str()
        .ok()
        .and_then(|h| h.strip_prefix("Basic ").or_else(|| h.strip_prefix("basic ")))
        .and_then(|b| STANDARD.decode(b.trim()).ok())
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    match basic {
        Some(up) => {
            let (u, p) = up.split_once(':').unwrap_or((up.as_str(), ""));
            let creds = (u.to_owned(), p.to_owned());
            issue(&s, req, Some(creds))
        }
        None => unauthorized("only Basic credentials are accepted"),
    }
}

/// `POST /token`: the OAuth2 password grant containerd uses when it has a secret.
async fn token_post(State(s): State<Arc<Signer>>, body: axum::body::Bytes) -> Response {
    let mut req = TokenRequest::parse(&body);
    if req.grant_type.as_deref() != Some("password") {
        return (StatusCode::BAD_REQUEST, "only grant_type=password is supported").into_response();
    }
    let creds = (req.username.take().unwrap_or_default(), req.password.take().unwrap_or_default());
    issue(&s, req, Some(creds))
}

fn issue(s: &Signer, req: TokenRequest, creds: Option<(String, String)>) -> Response {
    if let Some(v) = req.service.as_deref().filter(|v| *v != SERVICE) {
        return (StatusCode::BAD_REQUEST, format!("unknown service {v:?}; this server signs for {SERVICE}"))
            .into_response();
    }
    let subject = match creds {
        Some((u, p)) if u == s.policy.user && p == s.policy.password => Some(u),
        Some(_) => {
            s.refused.fetch_add(1, Ordering::Relaxed);
            return unauthorized("wrong username or password");
        }
        None => None,
    };
    let mut access = Vec::new();
    for scope in &req.scopes {
        // repository:NAME:ACTIONS; NAME has no ':' (a host:port prefix is not part of it).
        let Some((kind, rest)) = scope.split_once(':') else { continue };
        let Some((name, actions)) = rest.rsplit_once(':') else { continue };
        if kind != "repository" {
            continue;
        }
        let actions: Vec<String> = match subject {
            Some(_) => actions.split(',').map(str::to_owned).collect(),
            None if s.is_public(name) && actions.split(',').any(|a| a == "pull") => vec!["pull".to_owned()],
            None => vec![],
        };
        access.push((name.to_owned(), actions));
    }
    let jwt = s.sign(subject.as_deref().unwrap_or(""), &access, TOKEN_TTL);
    axum::Json(json!({
        "token": jwt,
        "access_token": jwt,
        "expires_in": TOKEN_TTL.as_secs(),
        "issued_at": berth_common::time::now_rfc3339(),
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base32_matches_rfc4648() {
        assert_eq!(base32(b"foobar"), "MZXW6YTBOI");
        assert_eq!(base32(b"f"), "MY");
    }

    #[test]
    fn key_id_shape() {
        let kid = libtrust_key_id(b"anything");
        assert_eq!(kid.len(), 48 + 11);
        assert_eq!(kid.split(':').count(), 12);
    }
}
