//! What an election is about (which Lease, who we are) and its timing, with Kubernetes' defaults.

use std::time::Duration;

/// One candidate's view of an election: the Lease, our identity, and the timing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Namespace of the Lease, e.g. `kube-system`.
    pub namespace: String,
    /// Name of the Lease, e.g. `kube-scheduler`.
    pub name: String,
    /// This candidate's identity, written to `spec.holderIdentity`; unique per process.
    pub identity: String,
    /// How long a non-leader waits, after last seeing the Lease change, before taking it over.
    /// Written to `spec.leaseDurationSeconds` rounded up to whole seconds.
    pub lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// How often candidates try to acquire and the leader renews.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// A config with kube-scheduler's and kube-controller-manager's defaults: lease 15 s, renew
    /// deadline 10 s, retry period 2 s.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Checks what client-go's `NewLeaderElector` checks, so a binary can reject bad flags early.
    /// The elector runs with any config, but only a valid one keeps two leaders from overlapping.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        for (field, value) in [("namespace", &self.namespace), ("name", &self.name), ("identity", &self.identity)] {
            if value.is_empty() {
                return Err(InvalidConfig::Empty { field });
            }
        }
        if self.retry_period.is_zero() {
            return Err(InvalidConfig::ZeroRetryPeriod);
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(InvalidConfig::LeaseNotLongerThanRenewDeadline);
        }
        if self.renew_deadline <= self.retry_period.mul_f64(crate::elector::JITTER_FACTOR) {
            return Err(InvalidConfig::RenewDeadlineTooShort);
        }
        Ok(())
    }
}

/// Why a [`LeaseConfig`] cannot keep leaders apart.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidConfig {
    #[error("lease {field} is empty")]
    Empty { field: &'static str },
    #[error("retry period must be greater than zero")]
    ZeroRetryPeriod,
    #[error("lease duration must be greater than renew deadline")]
    LeaseNotLongerThanRenewDeadline,
    #[error("renew deadline must be greater than retry period times 1.2")]
    RenewDeadlineTooShort,
}

/// `<hostname>_<random uuid>`, the identity kube-scheduler and kube-controller-manager use, so
/// two processes on one host never share one.
pub fn default_identity() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    format!("{host}_{}", uuid::Uuid::new_v4())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_kubernetes_defaults_and_valid() {
        let c = LeaseConfig::new("kube-system", "kube-scheduler", "me");
        assert_eq!(
            (c.lease_duration, c.renew_deadline, c.retry_period),
            (Duration::from_secs(15), Duration::from_secs(10), Duration::from_secs(2))
        );
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn a_renew_deadline_not_shorter_than_the_lease_is_rejected() {
        let mut c = LeaseConfig::new("kube-system", "kube-scheduler", "me");
        c.renew_deadline = c.lease_duration;
        assert_eq!(c.validate(), Err(InvalidConfig::LeaseNotLongerThanRenewDeadline));
        c.renew_deadline = Duration::from_millis(2400);
        assert_eq!(c.validate(), Err(InvalidConfig::RenewDeadlineTooShort));
        c.identity.clear();
        assert_eq!(c.validate(), Err(InvalidConfig::Empty { field: "identity" }));
    }

    #[test]
    fn default_identity_is_hostname_underscore_uuid_and_unique() {
        let a = default_identity();
        let (host, id) = a.rsplit_once('_').expect("an underscore");
        assert!(!host.is_empty());
        assert!(uuid::Uuid::parse_str(id).is_ok(), "{id}");
        assert_ne!(a, default_identity());
    }
}
