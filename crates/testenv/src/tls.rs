//! Certificates made on the fly with rcgen: a test CA and loopback serving certificates it
//! signs, so a registry can be served over HTTPS that clients trust through `ca_pem()`.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// A throwaway certificate authority.
pub struct TestCa {
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A serving certificate (PEM) and its private key (PKCS#8 PEM).
pub struct ServerCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().expect("generate CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let cert = params.self_signed(&key).expect("self-sign CA");
        TestCa { cert_pem: cert.pem(), issuer: Issuer::new(params, key) }
    }

    /// A certificate for `names` (DNS names or IP addresses), e.g. `["127.0.0.1", "localhost"]`.
    pub fn server_cert(&self, names: &[&str]) -> ServerCert {
        let key = KeyPair::generate().expect("generate server key");
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("server params");
        params.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or("localhost"));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer).expect("sign server cert");
        ServerCert { cert_pem: cert.pem(), key_pem: key.serialize_pem() }
    }
}
