//! The CA, serving certificate and admin kubeconfig the server keeps in its data dir.
//!
//! Layout under the data dir:
//!
//! - `pki/ca.crt`, `pki/ca.key`: the cluster CA, created once and kept forever.
//! - `pki/apiserver.crt`, `pki/apiserver.key`: the serving certificate, signed by the CA and
//!   reissued when it stops covering the names clients use or is about to expire.
//! - `pki/sa.key`: the service account token signing key (`crate::satoken`), created once
//!   unless `--service-account-signing-key-file` names another.
//! - `admin.token`: the admin bearer token, created once.
//! - `admin.kubeconfig`: rewritten on every start, since address and port may change.
//!
//! Private keys and token-bearing files are written with mode 0600. All keys are ECDSA P-256.

use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine;
use berth_common::fs::{WriteError, write_atomic};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SerialNumber,
};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};

const CA_VALIDITY_DAYS: i64 = 3650;
const SERVING_VALIDITY_DAYS: i64 = 365;
/// A serving certificate expiring sooner than this is reissued at startup.
const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// PEM material the API server needs to serve TLS and to hand out kubeconfigs.
#[derive(Clone)]
pub struct Pki {
    /// The CA certificate clients should trust.
    pub ca_pem: String,
    /// The serving certificate (leaf only; clients already hold the CA).
    pub server_cert_pem: String,
    /// The serving certificate's PKCS#8 private key.
    pub server_key_pem: String,
}

impl std::fmt::Debug for Pki {
    // Keeps the private key out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki")
            .field("ca_pem", &self.ca_pem)
            .field("server_cert_pem", &self.server_cert_pem)
            .finish_non_exhaustive()
    }
}

/// Why the PKI, token or kubeconfig could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot {action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot parse {what}")]
    Parse {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: &'static str },
    #[error("cannot generate certificate")]
    Certificate(#[source] rcgen::Error),
    #[error("cannot build tls configuration")]
    Rustls(#[source] rustls::Error),
}

impl From<WriteError> for TlsError {
    fn from(WriteError { action, path, source }: WriteError) -> Self {
        TlsError::Io { action, path, source }
    }
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> TlsError {
    let path = path.to_path_buf();
    move |source| TlsError::Io { action, path, source }
}

fn parse_err<E>(what: impl std::fmt::Display) -> impl FnOnce(E) -> TlsError
where
    E: std::error::Error + Send + Sync + 'static,
{
    let what = what.to_string();
    move |source| TlsError::Parse { what, source: Box::new(source) }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Loads or creates the CA and serving certificate under `data_dir/pki`.
///
/// The CA is created only when neither `ca.crt` nor `ca.key` exists. The serving certificate
/// is reissued when it is missing, unreadable, not signed by the CA, does not cover one of
/// the names in [`serving_sans`], or expires within 30 days.
pub fn ensure_pki(data_dir: &Path, bind: IpAddr, extra_sans: &[String]) -> Result<Pki, TlsError> {
    let dir = data_dir.join("pki");
    fs::create_dir_all(&dir).map_err(io_err("create", &dir))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).map_err(io_err("set permissions on", &dir))?;

    let (ca_pem, ca_key) = ensure_ca(&dir)?;
    let sans = serving_sans(bind, extra_sans);

    let cert_path = dir.join("apiserver.crt");
    let key_path = dir.join("apiserver.key");
    if let (Some(cert_pem), Some(key_pem)) = (read_optional(&cert_path)?, read_optional(&key_path)?) {
        match serving_cert_problem(&ca_pem, &cert_pem, &key_pem, &sans) {
            None => {
                restrict(&key_path)?;
                return Ok(Pki { ca_pem, server_cert_pem: cert_pem, server_key_pem: key_pem });
            }
            Some(problem) => {
                tracing::info!(path = %cert_path.display(), %problem, "reissuing serving certificate");
            }
        }
    }

    let (cert_pem, key_pem) = issue_serving_cert(&ca_key, &sans, SERVING_VALIDITY_DAYS)?;
    write_atomic(&key_path, key_pem.as_bytes(), 0o600)?;
    write_atomic(&cert_path, cert_pem.as_bytes(), 0o644)?;
    Ok(Pki { ca_pem, server_cert_pem: cert_pem, server_key_pem: key_pem })
}

/// The names the serving certificate must cover: loopback names, the bind address unless it
/// is unspecified, the machine's hostname, the in-cluster `kubernetes` service names, and
/// `extra_sans`, deduplicated in that order.
pub fn serving_sans(bind: IpAddr, extra_sans: &[String]) -> Vec<String> {
    let mut sans: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    if !bind.is_unspecified() {
        sans.push(bind.to_string());
    }
    // A non-ASCII hostname cannot be a DNS SAN; clients will use an IP or localhost instead.
    if let Some(host) = hostname().filter(|h| h.is_ascii()) {
        sans.push(host);
    }
    for name in ["kubernetes", "kubernetes.default", "kubernetes.default.svc"] {
        sans.push(name.into());
    }
    sans.extend(extra_sans.iter().cloned());
    let mut seen = std::collections::HashSet::new();
    sans.retain(|s| seen.insert(s.clone()));
    sans
}

/// The `https://` URL clients should use for a server bound to `bind:port`; an unspecified
/// bind address becomes the loopback address of the same family.
pub fn server_url(bind: IpAddr, port: u16) -> String {
    match bind {
        IpAddr::V4(ip) if ip.is_unspecified() => format!("https://{}:{port}", Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => format!("https://[{}]:{port}", Ipv6Addr::LOCALHOST),
        IpAddr::V4(ip) => format!("https://{ip}:{port}"),
        IpAddr::V6(ip) => format!("https://[{ip}]:{port}"),
    }
}

fn hostname() -> Option<String> {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|p| fs::read_to_string(p).ok())
        .map(|s| s.trim().to_ascii_lowercase())
        .find(|s| !s.is_empty())
}

/// Returns the CA certificate PEM and its key, creating both if neither exists.
fn ensure_ca(dir: &Path) -> Result<(String, KeyPair), TlsError> {
    let cert_path = dir.join("ca.crt");
    let key_path = dir.join("ca.key");
    match (read_optional(&cert_path)?, read_optional(&key_path)?) {
        (Some(cert_pem), Some(key_pem)) => {
            let key = KeyPair::from_pem(&key_pem).map_err(parse_err(key_path.display()))?;
            let cert = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(parse_err(cert_path.display()))?;
            // A mismatched key would sign serving certificates nobody can verify.
            if certified_key(vec![cert], &key_pem, &key_path).is_err() {
                return Err(TlsError::Invalid { path: key_path, reason: "does not match ca.crt" });
            }
            restrict(&key_path)?;
            Ok((cert_pem, key))
        }
        (None, None) => {
            let key = KeyPair::generate().map_err(TlsError::Certificate)?;
            let mut params = ca_params();
            set_validity(&mut params, CA_VALIDITY_DAYS);
            params.serial_number = Some(random_serial()?);
            let cert = params.self_signed(&key).map_err(TlsError::Certificate)?;
            write_atomic(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
            write_atomic(&cert_path, cert.pem().as_bytes(), 0o644)?;
            tracing::info!(path = %cert_path.display(), "created cluster ca");
            Ok((cert.pem(), key))
        }
        // Silently replacing half a CA would invalidate every kubeconfig handed out so far.
        (Some(_), None) => Err(TlsError::Invalid { path: key_path, reason: "missing while ca.crt exists" }),
        (None, Some(_)) => Err(TlsError::Invalid { path: cert_path, reason: "missing while ca.key exists" }),
    }
}

/// The CA's subject and key settings. Deterministic, so an [`Issuer`] rebuilt from it with the
/// stored key produces the same issuer name and authority key identifier as the stored CA.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "berth-ca");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params
}

/// Issues a serving certificate for `sans` valid for `days`; returns (cert PEM, key PEM).
fn issue_serving_cert(ca_key: &KeyPair, sans: &[String], days: i64) -> Result<(String, String), TlsError> {
    let key = KeyPair::generate().map_err(TlsError::Certificate)?;
    let mut params = CertificateParams::new(sans.to_vec()).map_err(TlsError::Certificate)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "berth-apiserver");
    params.distinguished_name = dn;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(random_serial()?);
    set_validity(&mut params, days);
    let issuer = Issuer::new(ca_params(), ca_key);
    let cert = params.signed_by(&key, &issuer).map_err(TlsError::Certificate)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Sets validity from yesterday (tolerating clock skew between hosts) until `days` from today.
fn set_validity(params: &mut CertificateParams, days: i64) {
    let today = jiff::Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC).date();
    let ymd = |d: jiff::civil::Date| rcgen::date_time_ymd(i32::from(d.year()), d.month() as u8, d.day() as u8);
    params.not_before = ymd(today.saturating_sub(jiff::Span::new().days(1)));
    params.not_after = ymd(today.saturating_add(jiff::Span::new().days(days)));
}

fn random_serial() -> Result<SerialNumber, TlsError> {
    let mut bytes = random_bytes::<16>()?;
    // A positive serial keeps the DER integer at 16 bytes and pleases strict parsers.
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    Ok(SerialNumber::from_slice(&bytes))
}

fn random_bytes<const N: usize>() -> Result<[u8; N], TlsError> {
    let mut bytes = [0u8; N];
    provider().secure_random.fill(&mut bytes).map_err(|_| TlsError::Rustls(rustls::Error::FailedToGetRandomBytes))?;
    Ok(bytes)
}

/// Why the stored serving certificate cannot be reused, or `None` if it can.
fn serving_cert_problem(ca_pem: &str, cert_pem: &str, key_pem: &str, sans: &[String]) -> Option<String> {
    let chain = match CertificateDer::pem_slice_iter(cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>() {
        Ok(chain) if !chain.is_empty() => chain,
        Ok(_) => return Some("no certificate in pem".into()),
        Err(e) => return Some(format!("unparsable certificate: {e}")),
    };
    let leaf = chain[0].clone();
    if let Err(e) = certified_key(chain, key_pem, Path::new("apiserver.key")) {
        return Some(format!("unusable key: {e}"));
    }
    let mut roots = RootCertStore::empty();
    let ca = match CertificateDer::from_pem_slice(ca_pem.as_bytes()) {
        Ok(ca) => ca,
        Err(e) => return Some(format!("unparsable ca: {e}")),
    };
    if let Err(e) = roots.add(ca) {
        return Some(format!("unusable ca: {e}"));
    }
    let verifier = match WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider()).build() {
        Ok(v) => v,
        Err(e) => return Some(format!("cannot build verifier: {e}")),
    };
    // Verifying "as of" 30 days from now rejects certificates about to expire.
    let since_epoch = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let later = UnixTime::since_unix_epoch(since_epoch + RENEW_BEFORE);
    for san in sans {
        // Names rustls cannot express (wildcards, underscores) cannot be checked; rcgen still
        // puts them in new certificates.
        let Ok(name) = ServerName::try_from(san.as_str()) else {
            continue;
        };
        if let Err(e) = verifier.verify_server_cert(&leaf, &[], &name, &[], later) {
            return Some(format!("not valid for {san} in 30 days: {e}"));
        }
    }
    None
}

fn certified_key(
    chain: Vec<CertificateDer<'static>>,
    key_pem: &str,
    key_path: &Path,
) -> Result<CertifiedKey, TlsError> {
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(parse_err(key_path.display()))?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(TlsError::Rustls)
}

/// Returns the admin bearer token stored in `data_dir/admin.token`, creating a random one
/// (32 bytes, hex) on first use.
pub fn ensure_admin_token(data_dir: &Path) -> Result<String, TlsError> {
    let path = data_dir.join("admin.token");
    if let Some(existing) = read_optional(&path)? {
        let token = existing.trim();
        if !token.is_empty() {
            restrict(&path)?;
            return Ok(token.to_string());
        }
    }
    fs::create_dir_all(data_dir).map_err(io_err("create", data_dir))?;
    let token: String = random_bytes::<32>()?.iter().map(|b| format!("{b:02x}")).collect();
    write_atomic(&path, format!("{token}\n").as_bytes(), 0o600)?;
    Ok(token)
}

/// Writes a kubeconfig (mode 0600) with cluster and context `berth` pointing at `server_url`,
/// trusting `ca_pem`, and authenticating as `user` with bearer `token`.
pub fn write_kubeconfig(path: &Path, server_url: &str, ca_pem: &str, user: &str, token: &str) -> Result<(), TlsError> {
    let ca_data = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes());
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "berth",
            "cluster": {
                "server": server_url,
                "certificate-authority-data": ca_data,
            },
        }],
        "users": [{
            "name": user,
            "user": { "token": token },
        }],
        "contexts": [{
            "name": "berth",
            "context": { "cluster": "berth", "user": user },
        }],
        "current-context": "berth",
        "preferences": {},
    });
    let yaml = serde_yaml::to_string(&config).map_err(parse_err("kubeconfig"))?;
    Ok(write_atomic(path, yaml.as_bytes(), 0o600)?)
}

/// A rustls server configuration for `pki` using the ring provider, offering ALPN `h2` (kubectl
/// watches and exec run over HTTP/2) and `http/1.1`, without client certificates.
pub fn rustls_config(pki: &Pki) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(pki.server_cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(parse_err("serving certificate"))?;
    let key = PrivateKeyDer::from_pem_slice(pki.server_key_pem.as_bytes()).map_err(parse_err("serving key"))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rustls)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(TlsError::Rustls)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn read_optional(path: &Path) -> Result<Option<String>, TlsError> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("read", path)(e)),
    }
}

/// Tightens a reused secret file that may have been copied in with looser permissions.
fn restrict(path: &Path) -> Result<(), TlsError> {
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(io_err("set permissions on", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    /// Runs a TLS handshake in memory and returns the negotiated ALPN protocol.
    fn handshake(server: Arc<ServerConfig>, ca_pem: &str, name: &str) -> Result<Option<Vec<u8>>, rustls::Error> {
        let mut roots = RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap()).unwrap();
        let mut client_config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        client_config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let name = ServerName::try_from(name.to_string()).unwrap();
        let mut client = rustls::ClientConnection::new(Arc::new(client_config), name)?;
        let mut server = rustls::ServerConnection::new(server)?;
        for _ in 0..10 {
            if !client.is_handshaking() && !server.is_handshaking() {
                return Ok(client.alpn_protocol().map(<[u8]>::to_vec));
            }
            let mut buf = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut buf).unwrap();
            }
            server.read_tls(&mut buf.as_slice()).unwrap();
            // Pass the server's alert to the client so it reports the real cause.
            let server_result = server.process_new_packets();
            buf.clear();
            while server.wants_write() {
                server.write_tls(&mut buf).unwrap();
            }
            client.read_tls(&mut buf.as_slice()).unwrap();
            client.process_new_packets()?;
            server_result?;
        }
        panic!("handshake did not finish");
    }

    #[test]
    fn a_second_ensure_pki_reuses_the_ca_and_serving_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let first = ensure_pki(dir.path(), LOCAL, &[]).unwrap();
        let second = ensure_pki(dir.path(), LOCAL, &[]).unwrap();
        assert_eq!(first.ca_pem, second.ca_pem);
        assert_eq!(first.server_cert_pem, second.server_cert_pem);
        assert_eq!(first.server_key_pem, second.server_key_pem);
        assert_eq!(mode(&dir.path().join("pki/ca.key")), 0o600);
        assert_eq!(mode(&dir.path().join("pki/apiserver.key")), 0o600);
        assert_eq!(mode(&dir.path().join("pki")), 0o700);
    }

    #[test]
    fn the_serving_certificate_verifies_against_the_ca_for_local_and_cluster_names() {
        let dir = tempfile::tempdir().unwrap();
        let pki = ensure_pki(dir.path(), LOCAL, &["berth.example.com".into()]).unwrap();
        let config = rustls_config(&pki).unwrap();
        let mut names = vec!["127.0.0.1", "localhost", "::1", "kubernetes.default.svc", "berth.example.com"];
        let host = hostname();
        if let Some(host) = host.as_deref().filter(|h| ServerName::try_from(*h).is_ok()) {
            names.push(host);
        }
        for name in names {
            let alpn = handshake(config.clone(), &pki.ca_pem, name)
                .unwrap_or_else(|e| panic!("handshake for {name} failed: {e}"));
            assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
        }
        let err = handshake(config, &pki.ca_pem, "example.org").unwrap_err();
        assert!(matches!(err, rustls::Error::InvalidCertificate(_)), "unexpected error {err:?}");
    }

    #[test]
    fn a_certificate_from_another_ca_is_rejected() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let pki_a = ensure_pki(a.path(), LOCAL, &[]).unwrap();
        let pki_b = ensure_pki(b.path(), LOCAL, &[]).unwrap();
        assert_ne!(pki_a.ca_pem, pki_b.ca_pem);
        assert!(handshake(rustls_config(&pki_a).unwrap(), &pki_b.ca_pem, "localhost").is_err());
    }

    #[test]
    fn a_new_bind_address_reissues_the_serving_certificate_but_keeps_the_ca() {
        let dir = tempfile::tempdir().unwrap();
        let first = ensure_pki(dir.path(), LOCAL, &[]).unwrap();
        let bind: IpAddr = "10.1.2.3".parse().unwrap();
        let second = ensure_pki(dir.path(), bind, &[]).unwrap();
        assert_eq!(first.ca_pem, second.ca_pem);
        assert_ne!(first.server_cert_pem, second.server_cert_pem);
        handshake(rustls_config(&second).unwrap(), &second.ca_pem, "10.1.2.3").unwrap();
        // An extra SAN the old certificate lacks also forces a reissue.
        let third = ensure_pki(dir.path(), bind, &["api.example.com".into()]).unwrap();
        assert_ne!(second.server_cert_pem, third.server_cert_pem);
        handshake(rustls_config(&third).unwrap(), &third.ca_pem, "api.example.com").unwrap();
    }

    #[test]
    fn a_serving_certificate_expiring_within_30_days_is_reissued() {
        let dir = tempfile::tempdir().unwrap();
        let first = ensure_pki(dir.path(), LOCAL, &[]).unwrap();
        let ca_key = KeyPair::from_pem(&fs::read_to_string(dir.path().join("pki/ca.key")).unwrap()).unwrap();
        let (cert, key) = issue_serving_cert(&ca_key, &serving_sans(LOCAL, &[]), 10).unwrap();
        fs::write(dir.path().join("pki/apiserver.crt"), &cert).unwrap();
        fs::write(dir.path().join("pki/apiserver.key"), &key).unwrap();
        let short = Pki { ca_pem: first.ca_pem.clone(), server_cert_pem: cert.clone(), server_key_pem: key };
        // The short-lived certificate is itself valid and signed by the stored CA.
        handshake(rustls_config(&short).unwrap(), &first.ca_pem, "localhost").unwrap();
        let renewed = ensure_pki(dir.path(), LOCAL, &[]).unwrap();
        assert_eq!(renewed.ca_pem, first.ca_pem);
        assert_ne!(renewed.server_cert_pem, cert);
    }

    #[test]
    fn half_a_ca_is_an_error_rather_than_silently_replaced() {
        let dir = tempfile::tempdir().unwrap();
        ensure_pki(dir.path(), LOCAL, &[]).unwrap();
        fs::remove_file(dir.path().join("pki/ca.key")).unwrap();
        let err = ensure_pki(dir.path(), LOCAL, &[]).unwrap_err();
        assert!(err.to_string().ends_with("ca.key: missing while ca.crt exists"), "{err}");
    }

    #[test]
    fn serving_sans_include_required_names_and_skip_unspecified_bind() {
        let sans = serving_sans(IpAddr::V4(Ipv4Addr::UNSPECIFIED), &["x.example".into()]);
        for want in
            ["localhost", "127.0.0.1", "::1", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "x.example"]
        {
            assert!(sans.iter().any(|s| s == want), "missing {want} in {sans:?}");
        }
        assert!(!sans.iter().any(|s| s == "0.0.0.0"));
        let sans = serving_sans("192.168.1.5".parse().unwrap(), &["localhost".into()]);
        assert!(sans.iter().any(|s| s == "192.168.1.5"));
        assert_eq!(sans.iter().filter(|s| *s == "localhost").count(), 1);
    }

    #[test]
    fn server_url_brackets_ipv6_and_maps_unspecified_to_loopback() {
        assert_eq!(server_url("0.0.0.0".parse().unwrap(), 6443), "https://127.0.0.1:6443");
        assert_eq!(server_url("::".parse().unwrap(), 6443), "https://[::1]:6443");
        assert_eq!(server_url("10.0.0.1".parse().unwrap(), 1), "https://10.0.0.1:1");
        assert_eq!(server_url("fe80::1".parse().unwrap(), 2), "https://[fe80::1]:2");
    }

    #[test]
    fn the_admin_token_is_random_private_and_stable() {
        let dir = tempfile::tempdir().unwrap();
        let token = ensure_admin_token(dir.path()).unwrap();
        assert_eq!(token.len(), 64);
        assert!(token.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(mode(&dir.path().join("admin.token")), 0o600);
        assert_eq!(ensure_admin_token(dir.path()).unwrap(), token);
        let other = tempfile::tempdir().unwrap();
        assert_ne!(ensure_admin_token(other.path()).unwrap(), token);
    }

    #[test]
    fn the_kubeconfig_is_private_and_has_the_expected_fields() {
        let dir = tempfile::tempdir().unwrap();
        let pki = ensure_pki(dir.path(), LOCAL, &[]).unwrap();
        let path = dir.path().join("admin.kubeconfig");
        // A pre-existing file with a wide mode must not keep it.
        fs::write(&path, "old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        write_kubeconfig(&path, "https://127.0.0.1:6443", &pki.ca_pem, "admin", "tok").unwrap();
        assert_eq!(mode(&path), 0o600);
        let doc: serde_yaml::Value = serde_yaml::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(doc["apiVersion"], "v1");
        assert_eq!(doc["kind"], "Config");
        assert_eq!(doc["current-context"], "berth");
        let cluster = &doc["clusters"][0];
        assert_eq!(cluster["name"], "berth");
        assert_eq!(cluster["cluster"]["server"], "https://127.0.0.1:6443");
        let ca_data = cluster["cluster"]["certificate-authority-data"].as_str().unwrap();
        let decoded = base64::engine::general_purpose::STANDARD.decode(ca_data).unwrap();
        assert_eq!(decoded, pki.ca_pem.as_bytes());
        assert_eq!(doc["users"][0]["name"], "admin");
        assert_eq!(doc["users"][0]["user"]["token"], "tok");
        assert_eq!(doc["contexts"][0]["name"], "berth");
        assert_eq!(doc["contexts"][0]["context"]["cluster"], "berth");
        assert_eq!(doc["contexts"][0]["context"]["user"], "admin");
    }

    /// Serves `GET /version` over TLS, answering 401 unless the bearer token matches.
    async fn serve_version(
        pki: &Pki,
        token: &str,
    ) -> (std::net::SocketAddr, axum_server::Handle<std::net::SocketAddr>) {
        let expected = format!("Bearer {token}");
        let app = axum::Router::new().route(
            "/version",
            axum::routing::get(move |headers: http::HeaderMap| async move {
                if headers.get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()) != Some(expected.as_str()) {
                    return Err(http::StatusCode::UNAUTHORIZED);
                }
                Ok(axum::Json(serde_json::json!({
                    "major": "1", "minor": "33", "gitVersion": "v1.33.0-berth",
                    "gitCommit": "", "gitTreeState": "", "buildDate": "",
                    "goVersion": "", "compiler": "", "platform": "linux/amd64",
                })))
            }),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let tls = axum_server::tls_rustls::RustlsConfig::from_config(rustls_config(pki).unwrap());
        let handle = axum_server::Handle::new();
        let server = axum_server::from_tcp_rustls(listener, tls).unwrap().handle(handle.clone());
        tokio::spawn(server.serve(app.into_make_service()));
        (addr, handle)
    }

    #[tokio::test]
    async fn the_kubeconfig_loads_in_kube_and_reaches_a_tls_server() {
        let dir = tempfile::tempdir().unwrap();
        let pki = ensure_pki(dir.path(), LOCAL, &[]).unwrap();
        let token = ensure_admin_token(dir.path()).unwrap();
        let (addr, handle) = serve_version(&pki, &token).await;
        let path = dir.path().join("admin.kubeconfig");
        let url = server_url(LOCAL, addr.port());
        write_kubeconfig(&path, &url, &pki.ca_pem, "admin", &token).unwrap();

        let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.unwrap();
        assert_eq!(config.cluster_url.to_string(), format!("{url}/"));
        let client = kube::Client::try_from(config).unwrap();
        let version = client.apiserver_version().await.unwrap();
        assert_eq!(version.git_version, "v1.33.0-berth");
        handle.shutdown();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn kubectl_accepts_the_kubeconfig_when_installed() {
        if std::process::Command::new("kubectl").arg("version").arg("--client").output().is_err() {
            eprintln!("kubectl not installed; skipping");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let pki = ensure_pki(dir.path(), LOCAL, &[]).unwrap();
        let token = ensure_admin_token(dir.path()).unwrap();
        let (addr, handle) = serve_version(&pki, &token).await;
        let path = dir.path().join("admin.kubeconfig");
        write_kubeconfig(&path, &server_url(LOCAL, addr.port()), &pki.ca_pem, "admin", &token).unwrap();
        let output = tokio::task::spawn_blocking(move || {
            std::process::Command::new("kubectl")
                .args(["version", "-o", "json", "--request-timeout=10s", "--kubeconfig"])
                .arg(&path)
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        handle.shutdown();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "kubectl failed: {stdout}{}", String::from_utf8_lossy(&output.stderr));
        assert!(stdout.contains("v1.33.0-berth"), "{stdout}");
    }
}
