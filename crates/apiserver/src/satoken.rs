//! Service account tokens: the signing key, the claims Kubernetes puts into its bound tokens,
//! signing (ES256 JWTs) and verification.
//!
//! The key is an ECDSA P-256 private key in PKCS#8 PEM, generated into
//! `<data-dir>/pki/sa.key` on first start unless `--service-account-signing-key-file` names one.
//! Tokens carry a `kid` header, the unpadded base64url SHA-256 of the public key's DER, as
//! kube-apiserver's. Verification accepts the signing key and every public key of
//! `--service-account-key-file` (PEM `PUBLIC KEY` or `PRIVATE KEY` blocks, P-256 only).
//!
//! Checking that the token's objects still exist is [`authenticate`]'s job: it reads the
//! ServiceAccount (and the bound pod or secret) from the store and compares uids.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use berth_api::resources::{PODS, SECRETS, SERVICEACCOUNTS};
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair, UnparsedPublicKey};
use rustls::pki_types::pem::{PemObject, SectionKind};
use serde_json::{Value, json};

use crate::authn::UserInfo;
use crate::{ApiState, objects};

/// The issuer kubeadm configures, and berth's default `--service-account-issuer`.
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// The generated signing key, under the data dir's `pki/`.
pub const SIGNING_KEY_FILE: &str = "sa.key";
/// A TokenRequest without `spec.expirationSeconds` gets an hour.
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
/// The shortest lifetime a TokenRequest may ask for.
pub const MIN_EXPIRATION_SECONDS: i64 = 600;
/// The longest lifetime a TokenRequest may ask for: 2^32 seconds.
pub const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;
/// Clock skew tolerated on `exp` and `nbf`, as go-jose's default leeway.
pub const LEEWAY_SECONDS: i64 = 60;
/// The prefix of a service account's user name; `<namespace>:<name>` follows.
pub const USER_PREFIX: &str = "system:serviceaccount:";
/// The prefix of the user's extra keys: `pod-name`, `pod-uid`, `node-name`, `node-uid`,
/// `credential-id`.
pub const EXTRA_PREFIX: &str = "authentication.kubernetes.io/";
/// Every service account is in this group, and in `system:serviceaccounts:<namespace>`.
pub const ALL_GROUP: &str = "system:serviceaccounts";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read service account key file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write service account key file {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("service account key file {}: {reason}", path.display())]
    Parse { path: PathBuf, reason: String },
    #[error("cannot generate a service account signing key")]
    Generate,
}

/// A name and uid, as the `kubernetes.io` claim records objects.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObjectRef {
    pub name: String,
    pub uid: String,
}

impl ObjectRef {
    fn to_json(&self) -> Value {
        json!({"name": self.name, "uid": self.uid})
    }

    fn from_json(v: Option<&Value>) -> Option<ObjectRef> {
        let v = v?;
        Some(ObjectRef {
            name: v.get("name")?.as_str()?.to_string(),
            uid: v.get("uid").and_then(Value::as_str).unwrap_or_default().to_string(),
        })
    }
}

/// The claims of a bound service account token (Kubernetes' `privateClaims` plus the JWT's
/// registered claims).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub issuer: String,
    pub audiences: Vec<String>,
    /// Seconds since the epoch.
    pub issued_at: i64,
    pub expires_at: i64,
    pub id: String,
    pub namespace: String,
    pub service_account: ObjectRef,
    pub pod: Option<ObjectRef>,
    pub secret: Option<ObjectRef>,
    pub node: Option<ObjectRef>,
}

impl Claims {
    /// Claims for a token issued `now` that lives `expiration_seconds`.
    pub fn new(
        issuer: &str,
        audiences: Vec<String>,
        now: i64,
        expiration_seconds: i64,
        namespace: &str,
        service_account: ObjectRef,
    ) -> Claims {
        Claims {
            issuer: issuer.to_string(),
            audiences,
            issued_at: now,
            expires_at: now + expiration_seconds,
            id: uuid::Uuid::new_v4().to_string(),
            namespace: namespace.to_string(),
            service_account,
            pod: None,
            secret: None,
            node: None,
        }
    }

    /// `system:serviceaccount:<namespace>:<name>`.
    pub fn subject(&self) -> String {
        format!("{USER_PREFIX}{}:{}", self.namespace, self.service_account.name)
    }

    /// The JWT payload. A single audience is a string, several an array, as go-jose writes them.
    pub fn to_json(&self) -> Value {
        let mut k8s = json!({"namespace": self.namespace, "serviceaccount": self.service_account.to_json()});
        for (key, r) in [("pod", &self.pod), ("secret", &self.secret), ("node", &self.node)] {
            if let Some(r) = r {
                k8s[key] = r.to_json();
            }
        }
        let aud = match self.audiences.as_slice() {
            [one] => json!(one),
            many => json!(many),
        };
        json!({
            "aud": aud,
            "exp": self.expires_at,
            "iat": self.issued_at,
            "iss": self.issuer,
            "jti": self.id,
            "kubernetes.io": k8s,
            "nbf": self.issued_at,
            "sub": self.subject(),
        })
    }

    /// Reads a payload; `None` if it is not a service account token of this shape.
    pub fn from_json(v: &Value) -> Option<Claims> {
        let audiences = match v.get("aud")? {
            Value::String(s) => vec![s.clone()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).map(String::from).collect(),
            _ => return None,
        };
        let k8s = v.get("kubernetes.io")?;
        let claims = Claims {
            issuer: v.get("iss")?.as_str()?.to_string(),
            audiences,
            issued_at: v.get("iat").and_then(Value::as_i64).unwrap_or_default(),
            expires_at: v.get("exp")?.as_i64()?,
            id: v.get("jti").and_then(Value::as_str).unwrap_or_default().to_string(),
            namespace: k8s.get("namespace")?.as_str()?.to_string(),
            service_account: ObjectRef::from_json(k8s.get("serviceaccount"))?,
            pod: ObjectRef::from_json(k8s.get("pod")),
            secret: ObjectRef::from_json(k8s.get("secret")),
            node: ObjectRef::from_json(k8s.get("node")),
        };
        // The subject must agree with the private claims it summarizes.
        (v.get("sub").and_then(Value::as_str) == Some(claims.subject().as_str())).then_some(claims)
    }

    /// Valid at `now`: not expired and not before `nbf`, each with [`LEEWAY_SECONDS`].
    pub fn is_current(&self, nbf: i64, now: i64) -> bool {
        now < self.expires_at + LEEWAY_SECONDS && now + LEEWAY_SECONDS >= nbf
    }

    /// The user the token authenticates as, with the token's id and its pod and node as extra.
    pub fn user(&self) -> UserInfo {
        let mut extra = std::collections::BTreeMap::new();
        if !self.id.is_empty() {
            extra.insert(format!("{EXTRA_PREFIX}credential-id"), vec![format!("JTI={}", self.id)]);
        }
        for (kind, r) in [("pod", &self.pod), ("node", &self.node)] {
            if let Some(r) = r {
                extra.insert(format!("{EXTRA_PREFIX}{kind}-name"), vec![r.name.clone()]);
                extra.insert(format!("{EXTRA_PREFIX}{kind}-uid"), vec![r.uid.clone()]);
            }
        }
        UserInfo {
            name: self.subject(),
            uid: self.service_account.uid.clone(),
            groups: vec![
                ALL_GROUP.to_string(),
                format!("{ALL_GROUP}:{}", self.namespace),
                "system:authenticated".to_string(),
            ],
            extra,
        }
    }
}

/// The `expirationSeconds` a TokenRequest asks for, defaulted, or the field error's detail.
pub fn expiration_seconds(requested: Option<i64>) -> Result<i64, (i64, &'static str)> {
    match requested {
        None => Ok(DEFAULT_EXPIRATION_SECONDS),
        Some(s) if s < MIN_EXPIRATION_SECONDS => Err((s, "may not specify a duration less than 10 minutes")),
        Some(s) if s > MAX_EXPIRATION_SECONDS => Err((s, "may not specify a duration larger than 2^32 seconds")),
        Some(s) => Ok(s),
    }
}

/// Signs and verifies service account tokens.
pub struct TokenKeys {
    signer: EcdsaKeyPair,
    key_id: String,
    /// Uncompressed P-256 points of every key tokens may be signed with.
    verifiers: Vec<Vec<u8>>,
    /// `--service-account-issuer`.
    pub issuer: String,
    /// `--api-audiences`: a token must name one of these to authenticate to the API.
    pub api_audiences: Vec<String>,
}

impl std::fmt::Debug for TokenKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenKeys").field("key_id", &self.key_id).field("issuer", &self.issuer).finish()
    }
}

impl TokenKeys {
    /// Keys from a PKCS#8 PEM signing key; `public_pems` adds keys that verify only.
    /// Empty `api_audiences` means the issuer.
    pub fn from_pem(
        signing_pem: &str,
        public_pems: &[String],
        issuer: &str,
        api_audiences: Vec<String>,
    ) -> Result<TokenKeys, String> {
        let der = pkcs8_der(signing_pem)?;
        let signer = EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &der, &SystemRandom::new())
            .map_err(|e| format!("not an ECDSA P-256 private key: {e}"))?;
        let point = signer.public_key().as_ref().to_vec();
        let mut verifiers = vec![point.clone()];
        for pem in public_pems {
            verifiers.extend(public_points(pem)?);
        }
        let spki = [P256_SPKI_PREFIX, &point].concat();
        let key_id = URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, &spki));
        let api_audiences = if api_audiences.is_empty() { vec![issuer.to_string()] } else { api_audiences };
        Ok(TokenKeys { signer, key_id, verifiers, issuer: issuer.to_string(), api_audiences })
    }

    /// The verifying keys as a JSON Web Key Set, served at `/openid/v1/jwks` so that other
    /// parties can check the tokens (OIDC discovery).
    pub fn jwks(&self) -> Value {
        let keys: Vec<Value> = self
            .verifiers
            .iter()
            .filter(|p| p.len() == 65 && p[0] == 4)
            .map(|point| {
                let spki = [P256_SPKI_PREFIX, point].concat();
                json!({
                    "use": "sig",
                    "kty": "EC",
                    "kid": URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, &spki)),
                    "crv": "P-256",
                    "alg": "ES256",
                    "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
                    "y": URL_SAFE_NO_PAD.encode(&point[33..]),
                })
            })
            .collect();
        json!({"keys": keys})
    }

    /// The OIDC discovery document served at `/.well-known/openid-configuration`; the key set
    /// is found under the issuer, as kube-apiserver computes it without `--service-account-jwks-uri`.
    pub fn openid_configuration(&self) -> Value {
        json!({
            "issuer": self.issuer,
            "jwks_uri": format!("{}/openid/v1/jwks", self.issuer.trim_end_matches('/')),
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
        })
    }

    /// Fresh keys with the default issuer, for tests and throwaway servers.
    pub fn generate() -> TokenKeys {
        let pem = generate_pem().expect("generating a P-256 key");
        TokenKeys::from_pem(&pem, &[], DEFAULT_ISSUER, Vec::new()).expect("a generated key loads")
    }

    /// The signed JWT for `claims`.
    pub fn sign(&self, claims: &Claims) -> String {
        let header = json!({"alg": "ES256", "kid": self.key_id});
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_json().to_string())
        );
        let sig = self.signer.sign(&SystemRandom::new(), input.as_bytes()).expect("ECDSA signing does not fail");
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
    }

    /// The claims of `token` if one of our keys signed it, our issuer issued it, it is current
    /// at `now` and names one of `audiences`.
    pub fn verify(&self, token: &str, audiences: &[String], now: i64) -> Option<Claims> {
        let mut parts = token.split('.');
        let (header, payload, sig) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let header: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).ok()?).ok()?;
        if header.get("alg").and_then(Value::as_str) != Some("ES256") {
            return None;
        }
        let sig = URL_SAFE_NO_PAD.decode(sig).ok()?;
        let signed = &token[..header_len(token)?];
        let verified = self.verifiers.iter().any(|point| {
            UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point).verify(signed.as_bytes(), &sig).is_ok()
        });
        if !verified {
            return None;
        }
        let payload: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()?;
        let claims = Claims::from_json(&payload)?;
        let nbf = payload.get("nbf").and_then(Value::as_i64).unwrap_or(claims.issued_at);
        let ok = claims.issuer == self.issuer
            && claims.is_current(nbf, now)
            && claims.audiences.iter().any(|a| audiences.contains(a));
        ok.then_some(claims)
    }
}

/// Length of `header.payload` in a JWT.
fn header_len(token: &str) -> Option<usize> {
    token.rfind('.')
}

/// The DER SubjectPublicKeyInfo of a P-256 key up to its 65-byte point.
const P256_SPKI_PREFIX: &[u8] = &[
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce,
    0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

fn pkcs8_der(pem: &str) -> Result<Vec<u8>, String> {
    for item in <(SectionKind, Vec<u8>)>::pem_slice_iter(pem.as_bytes()) {
        let (kind, der) = item.map_err(|e| format!("bad PEM: {e}"))?;
        if kind == SectionKind::PrivateKey {
            return Ok(der);
        }
    }
    Err("no PKCS#8 PRIVATE KEY block".into())
}

/// The P-256 points of the `PUBLIC KEY` and `PRIVATE KEY` blocks of a PEM file.
fn public_points(pem: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut points = Vec::new();
    for item in <(SectionKind, Vec<u8>)>::pem_slice_iter(pem.as_bytes()) {
        let (kind, der) = item.map_err(|e| format!("bad PEM: {e}"))?;
        match kind {
            SectionKind::PublicKey => match der.strip_prefix(P256_SPKI_PREFIX) {
                Some(point) if point.len() == 65 => points.push(point.to_vec()),
                _ => return Err("only ECDSA P-256 public keys are supported".into()),
            },
            SectionKind::PrivateKey => {
                let key =
                    EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &der, &SystemRandom::new())
                        .map_err(|e| format!("not an ECDSA P-256 private key: {e}"))?;
                points.push(key.public_key().as_ref().to_vec());
            }
            _ => {}
        }
    }
    if points.is_empty() {
        return Err("no public keys found".into());
    }
    Ok(points)
}

fn generate_pem() -> Result<String, KeyError> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|_| KeyError::Generate)?;
    Ok(key.serialize_pem())
}

/// kube-apiserver's service account flags.
#[derive(Debug, Clone)]
pub struct KeyOptions {
    /// `--service-account-signing-key-file`; `None`: `<data-dir>/pki/sa.key`, generated.
    pub signing_key_file: Option<PathBuf>,
    /// `--service-account-key-file`: more keys that verify tokens.
    pub key_files: Vec<PathBuf>,
    /// `--service-account-issuer`.
    pub issuer: String,
    /// `--api-audiences`; empty: the issuer.
    pub api_audiences: Vec<String>,
}

impl Default for KeyOptions {
    fn default() -> Self {
        KeyOptions {
            signing_key_file: None,
            key_files: Vec::new(),
            issuer: DEFAULT_ISSUER.to_string(),
            api_audiences: Vec::new(),
        }
    }
}

/// The service account keys of a server: `signing_key_file` (or `<data-dir>/pki/sa.key`, created
/// with mode 0600 if missing) signs, it and `key_files` verify.
pub fn load_keys(
    data_dir: &Path,
    signing_key_file: Option<&Path>,
    key_files: &[PathBuf],
    issuer: &str,
    api_audiences: Vec<String>,
) -> Result<TokenKeys, KeyError> {
    let read = |path: &Path| fs::read_to_string(path).map_err(|source| KeyError::Read { path: path.into(), source });
    let (path, signing_pem) = match signing_key_file {
        Some(path) => (path.to_path_buf(), read(path)?),
        None => {
            let path = data_dir.join("pki").join(SIGNING_KEY_FILE);
            match fs::read_to_string(&path) {
                Ok(pem) => (path, pem),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let pem = generate_pem()?;
                    write_private(&path, &pem)?;
                    (path, pem)
                }
                Err(source) => return Err(KeyError::Read { path, source }),
            }
        }
    };
    let mut public = Vec::new();
    for file in key_files {
        public.push(read(file)?);
    }
    TokenKeys::from_pem(&signing_pem, &public, issuer, api_audiences)
        .map_err(|reason| KeyError::Parse { path: path.clone(), reason })
}

fn write_private(path: &Path, contents: &str) -> Result<(), KeyError> {
    let err = |source| KeyError::Write { path: path.into(), source };
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(err)?;
    }
    let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(err)?;
    f.write_all(contents.as_bytes()).map_err(err)
}

/// The uid of the stored object, if it exists.
async fn stored_uid(state: &ApiState, rt: &berth_api::resources::ResourceType, ns: &str, name: &str) -> Option<String> {
    let kv = state.store.get(&objects::key(rt, Some(ns), name)).await.ok()??;
    let obj = objects::decode_kv(rt, &kv).ok()?;
    objects::meta_str(&obj, "uid").map(String::from)
}

/// The user of a service account token the server signed, if it is valid now for the API's
/// audiences and its ServiceAccount (and bound pod or secret) still exist with the same uids.
pub async fn authenticate(state: &ApiState, token: &str) -> Option<UserInfo> {
    let keys = state.service_account_tokens.as_ref()?;
    let claims = keys.verify(token, &keys.api_audiences, jiff::Timestamp::now().as_second())?;
    verify_objects(state, &claims).await.then(|| claims.user())
}

/// Whether the objects a token names still exist with the uids it recorded.
pub async fn verify_objects(state: &ApiState, claims: &Claims) -> bool {
    let ns = &claims.namespace;
    let same = |found: Option<String>, want: &ObjectRef| found.is_some_and(|uid| uid == want.uid);
    if !same(stored_uid(state, &SERVICEACCOUNTS, ns, &claims.service_account.name).await, &claims.service_account) {
        return false;
    }
    if let Some(pod) = &claims.pod
        && !same(stored_uid(state, &PODS, ns, &pod.name).await, pod)
    {
        return false;
    }
    if let Some(secret) = &claims.secret
        && !same(stored_uid(state, &SECRETS, ns, &secret.name).await, secret)
    {
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(now: i64, seconds: i64) -> Claims {
        let sa = ObjectRef { name: "default".into(), uid: "sa-uid".into() };
        Claims::new(DEFAULT_ISSUER, vec![DEFAULT_ISSUER.into()], now, seconds, "team", sa)
    }

    #[test]
    fn claims_carry_kubernetes_names_and_times() {
        let mut c = claims(1_000, 3600);
        c.pod = Some(ObjectRef { name: "web".into(), uid: "pod-uid".into() });
        let v = c.to_json();
        assert_eq!(v["sub"], "system:serviceaccount:team:default");
        assert_eq!(v["aud"], DEFAULT_ISSUER, "a single audience is a string");
        assert_eq!((v["iat"].as_i64(), v["nbf"].as_i64(), v["exp"].as_i64()), (Some(1_000), Some(1_000), Some(4_600)));
        assert_eq!(
            v["kubernetes.io"],
            json!({"namespace": "team", "serviceaccount": {"name": "default", "uid": "sa-uid"},
                   "pod": {"name": "web", "uid": "pod-uid"}})
        );
        assert_eq!(Claims::from_json(&v), Some(c.clone()));
        let extra = c.user().extra;
        assert_eq!(extra["authentication.kubernetes.io/pod-name"], ["web"]);
        assert_eq!(extra["authentication.kubernetes.io/pod-uid"], ["pod-uid"]);
        assert_eq!(extra["authentication.kubernetes.io/credential-id"], [format!("JTI={}", c.id)]);
    }

    #[test]
    fn the_key_set_names_the_signing_key_by_the_kid_tokens_carry_and_discovery_points_at_it() {
        let keys = TokenKeys::generate();
        let token = keys.sign(&claims(1_000, 3600));
        let header: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(token.split('.').next().unwrap()).unwrap()).unwrap();
        let jwks = keys.jwks();
        let key = &jwks["keys"][0];
        assert_eq!(key["kid"], header["kid"]);
        assert_eq!(
            (key["kty"].as_str(), key["crv"].as_str(), key["alg"].as_str()),
            (Some("EC"), Some("P-256"), Some("ES256"))
        );
        assert_eq!(URL_SAFE_NO_PAD.decode(key["x"].as_str().unwrap()).unwrap().len(), 32);
        let discovery = keys.openid_configuration();
        assert_eq!(discovery["issuer"], DEFAULT_ISSUER);
        assert_eq!(discovery["jwks_uri"], format!("{DEFAULT_ISSUER}/openid/v1/jwks"));
    }

    #[test]
    fn expiration_defaults_to_an_hour_and_refuses_less_than_ten_minutes() {
        assert_eq!(expiration_seconds(None), Ok(3600));
        assert_eq!(expiration_seconds(Some(600)), Ok(600));
        assert_eq!(expiration_seconds(Some(599)), Err((599, "may not specify a duration less than 10 minutes")));
        assert!(expiration_seconds(Some((1 << 32) + 1)).is_err());
    }

    #[test]
    fn a_signed_token_verifies_until_it_expires_and_only_for_its_audience() {
        let keys = TokenKeys::generate();
        let token = keys.sign(&claims(1_000, 600));
        let api = keys.api_audiences.clone();
        assert!(keys.verify(&token, &api, 1_000).is_some());
        assert!(keys.verify(&token, &api, 1_600 + LEEWAY_SECONDS - 1).is_some(), "within the leeway");
        assert!(keys.verify(&token, &api, 1_600 + LEEWAY_SECONDS).is_none(), "expired");
        assert!(keys.verify(&token, &["vault".into()], 1_000).is_none(), "another audience");
        assert_eq!(
            keys.verify(&token, &api, 1_000).unwrap().user().groups,
            ["system:serviceaccounts", "system:serviceaccounts:team", "system:authenticated"]
        );
    }

    #[test]
    fn a_token_of_another_key_or_issuer_or_with_a_changed_payload_is_refused() {
        let keys = TokenKeys::generate();
        let other = TokenKeys::generate();
        let api = keys.api_audiences.clone();
        assert!(keys.verify(&other.sign(&claims(1_000, 600)), &api, 1_000).is_none());
        let mut foreign = claims(1_000, 600);
        foreign.issuer = "https://elsewhere".into();
        assert!(keys.verify(&keys.sign(&foreign), &api, 1_000).is_none());
        let token = keys.sign(&claims(1_000, 600));
        let mut parts: Vec<&str> = token.split('.').collect();
        let mut forged = claims(1_000, 600);
        forged.namespace = "kube-system".into();
        let forged_payload = URL_SAFE_NO_PAD.encode(forged.to_json().to_string());
        parts[1] = &forged_payload;
        assert!(keys.verify(&parts.join("."), &api, 1_000).is_none());
    }

    #[test]
    fn a_key_file_public_key_verifies_tokens_of_its_private_key() {
        let old = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let old_keys = TokenKeys::from_pem(&old.serialize_pem(), &[], DEFAULT_ISSUER, Vec::new()).unwrap();
        let current =
            TokenKeys::from_pem(&generate_pem().unwrap(), &[old.public_key_pem()], DEFAULT_ISSUER, Vec::new()).unwrap();
        let token = old_keys.sign(&claims(1_000, 600));
        assert!(current.verify(&token, &current.api_audiences, 1_000).is_some());
        let rsa = "-----BEGIN PUBLIC KEY-----\nMA0GCSqGSIb3DQEBAQUAAwIAAA==\n-----END PUBLIC KEY-----\n";
        let refused = TokenKeys::from_pem(&generate_pem().unwrap(), &[rsa.into()], DEFAULT_ISSUER, Vec::new());
        assert_eq!(refused.unwrap_err(), "only ECDSA P-256 public keys are supported");
    }

    #[test]
    fn keys_load_from_the_data_dir_and_are_kept_private_and_stable() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let first = load_keys(dir.path(), None, &[], DEFAULT_ISSUER, Vec::new()).unwrap();
        let path = dir.path().join("pki").join(SIGNING_KEY_FILE);
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let second = load_keys(dir.path(), None, &[], DEFAULT_ISSUER, Vec::new()).unwrap();
        let token = first.sign(&claims(1_000, 600));
        assert!(second.verify(&token, &second.api_audiences, 1_000).is_some());
    }
}
