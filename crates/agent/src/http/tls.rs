//! The agent's self-signed serving certificate, made on first start in the cert dir as kubelet does
//! without `--tls-cert-file`: `kubelet.crt` and `kubelet.key` (mode 0600), ECDSA P-256, one year.
//!
//! Clients do not verify it: the control plane connects without a kubelet CA, as kube-apiserver
//! does without `--kubelet-certificate-authority`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use berth_common::fs::{WriteError, write_atomic};
use rcgen::{CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

const VALIDITY_DAYS: i64 = 365;

/// Why the serving certificate could not be made or loaded.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot {action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot generate the certificate")]
    Generate(#[source] rcgen::Error),
    #[error("cannot use the certificate in {}", path.display())]
    Unusable {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl From<WriteError> for CertError {
    fn from(WriteError { action, path, source }: WriteError) -> Self {
        CertError::Io { action, path, source }
    }
}

/// Loads `kubelet.crt`/`kubelet.key` from `dir`, creating them when either is missing, and
/// returns a rustls configuration serving them with ALPN `h2` and `http/1.1`.
pub fn serving_config(dir: &Path, node_name: &str) -> Result<Arc<ServerConfig>, CertError> {
    let cert_path = dir.join("kubelet.crt");
    let key_path = dir.join("kubelet.key");
    if !(cert_path.exists() && key_path.exists()) {
        create(dir, &cert_path, &key_path, node_name)?;
    }
    let read =
        |path: &Path| fs::read(path).map_err(|source| CertError::Io { action: "read", path: path.into(), source });
    let (cert_pem, key_pem) = (read(&cert_path)?, read(&key_path)?);
    let unusable = |path: &Path| {
        let path = path.to_path_buf();
        move |e: rustls::pki_types::pem::Error| CertError::Unusable { path, source: Box::new(e) }
    };
    let chain =
        CertificateDer::pem_slice_iter(&cert_pem).collect::<Result<Vec<_>, _>>().map_err(unusable(&cert_path))?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(unusable(&key_path))?;
    let mut config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
        .map_err(|e| CertError::Unusable { path: cert_path.clone(), source: Box::new(e) })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn create(dir: &Path, cert_path: &Path, key_path: &Path, node_name: &str) -> Result<(), CertError> {
    fs::create_dir_all(dir).map_err(|source| CertError::Io { action: "create", path: dir.into(), source })?;
    let mut names = vec![node_name.to_string(), "localhost".into(), "127.0.0.1".into(), "::1".into()];
    if let Some(host) = fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_ascii_lowercase())
        && !host.is_empty()
        && host.is_ascii()
    {
        names.push(host);
    }
    names.dedup();
    let mut params = CertificateParams::new(names).map_err(CertError::Generate)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("{node_name}@berth-agent"));
    params.distinguished_name = dn;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let today = jiff::Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC).date();
    let ymd = |d: jiff::civil::Date| rcgen::date_time_ymd(i32::from(d.year()), d.month() as u8, d.day() as u8);
    params.not_before = ymd(today.saturating_sub(jiff::Span::new().days(1)));
    params.not_after = ymd(today.saturating_add(jiff::Span::new().days(VALIDITY_DAYS)));
    let key = KeyPair::generate().map_err(CertError::Generate)?;
    let cert = params.self_signed(&key).map_err(CertError::Generate)?;
    write_atomic(key_path, key.serialize_pem().as_bytes(), 0o600)?;
    write_atomic(cert_path, cert.pem().as_bytes(), 0o644)?;
    tracing::info!(path = %cert_path.display(), "created a self-signed serving certificate");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_certificate_is_made_once_with_a_private_key_and_then_reused() {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        serving_config(&pki, "node-a").unwrap();
        let cert = fs::read(pki.join("kubelet.crt")).unwrap();
        let mode = fs::metadata(pki.join("kubelet.key")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let config = serving_config(&pki, "node-a").unwrap();
        assert_eq!(fs::read(pki.join("kubelet.crt")).unwrap(), cert, "the second start reuses the certificate");
        assert_eq!(config.alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
    }

    #[test]
    fn a_corrupt_key_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        serving_config(dir.path(), "node-a").unwrap();
        fs::write(dir.path().join("kubelet.key"), "garbage").unwrap();
        let err = serving_config(dir.path(), "node-a").unwrap_err();
        assert!(err.to_string().ends_with("kubelet.key"), "{err}");
    }
}
