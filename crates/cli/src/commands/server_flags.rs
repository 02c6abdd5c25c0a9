//! `berth server` flags for service account tokens and the admission chain, by
//! kube-apiserver's names.

use std::path::PathBuf;

use berth_apiserver::admission::Admission;
use berth_apiserver::satoken::{DEFAULT_ISSUER, KeyOptions};

#[derive(clap::Args, Clone, Debug)]
pub struct ServiceAccountArgs {
    /// PEM file with the private key (ECDSA P-256, PKCS#8) that signs service account tokens;
    /// default: <data-dir>/pki/sa.key, generated on first start.
    #[arg(long, value_name = "FILE")]
    service_account_signing_key_file: Option<PathBuf>,
    /// PEM files with more public (or private) keys that verify service account tokens.
    #[arg(long, value_name = "FILE", value_delimiter = ',')]
    service_account_key_file: Vec<PathBuf>,
    /// The `iss` of service account tokens.
    #[arg(long, default_value = DEFAULT_ISSUER)]
    service_account_issuer: String,
    /// Audiences a token must name to authenticate to the API; default: the issuer.
    #[arg(long, value_delimiter = ',')]
    api_audiences: Vec<String>,
}

impl ServiceAccountArgs {
    pub fn options(&self) -> KeyOptions {
        KeyOptions {
            signing_key_file: self.service_account_signing_key_file.clone(),
            key_files: self.service_account_key_file.clone(),
            issuer: self.service_account_issuer.clone(),
            api_audiences: self.api_audiences.iter().filter(|a| !a.is_empty()).cloned().collect(),
        }
    }
}

#[derive(clap::Args, Clone, Debug)]
pub struct AdmissionPluginArgs {
    /// Admission plugins to turn on besides the default ones (all of berth's are on by default).
    #[arg(long, value_delimiter = ',')]
    enable_admission_plugins: Vec<String>,
    /// Admission plugins to turn off (ServiceAccount is the one that can be).
    #[arg(long, value_delimiter = ',')]
    disable_admission_plugins: Vec<String>,
}

impl AdmissionPluginArgs {
    pub fn apply(&self, admission: &mut Admission) -> anyhow::Result<()> {
        admission
            .set_plugins(&self.enable_admission_plugins, &self.disable_admission_plugins)
            .map_err(anyhow::Error::msg)
    }
}
