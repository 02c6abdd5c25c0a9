//! Service account tokens for projected `serviceAccountToken` volume sources, as kubelet's token
//! manager keeps them: which tokens a pod needs, the TokenRequest that asks for one (the pod's
//! ServiceAccount, the source's audience and lifetime, bound to the pod), and when a token held
//! must be replaced (once 80% of its lifetime has passed, or 24 hours, less a jitter).
//!
//! Pure: the worker sends the requests and keeps the tokens; [`Token::needs_refresh`] decides.

use std::collections::BTreeSet;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1 as core;

/// A projection's lifetime when it names none (the API's default for `expirationSeconds`).
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
/// A token older than this is replaced whatever its lifetime (kubelet's `maxTTL`).
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Refreshes are spread over up to this much (kubelet's `maxJitter`).
pub const MAX_JITTER: Duration = Duration::from_secs(10);

/// What a token is asked for with; one token per key serves every source of the pod that
/// names it (the ServiceAccount and the bound pod are the pod's own).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenKey {
    /// Empty: the API's own audiences.
    pub audience: String,
    pub expiration_seconds: i64,
}

impl TokenKey {
    pub fn of(p: &core::ServiceAccountTokenProjection) -> TokenKey {
        TokenKey {
            audience: p.audience.clone().unwrap_or_default(),
            expiration_seconds: p.expiration_seconds.unwrap_or(DEFAULT_EXPIRATION_SECONDS),
        }
    }
}

/// The tokens the pod's projected volumes need.
pub fn referenced(spec: &core::PodSpec) -> BTreeSet<TokenKey> {
    spec.volumes
        .iter()
        .flatten()
        .filter_map(|v| v.projected.as_ref())
        .flat_map(|p| p.sources.iter().flatten())
        .filter_map(|s| s.service_account_token.as_ref())
        .map(TokenKey::of)
        .collect()
}

/// The pod's ServiceAccount (`default` when the pod names none).
pub fn service_account(pod: &core::Pod) -> String {
    let spec = pod.spec.as_ref();
    spec.and_then(|s| s.service_account_name.clone())
        .filter(|n| !n.is_empty())
        .or_else(|| spec.and_then(|s| s.service_account.clone()).filter(|n| !n.is_empty()))
        .unwrap_or_else(|| "default".to_string())
}

/// kubelet's TokenRequest for `key`: bound to the pod, so the token dies with it.
pub fn request(pod: &core::Pod, key: &TokenKey) -> TokenRequest {
    TokenRequest {
        spec: TokenRequestSpec {
            audiences: if key.audience.is_empty() { Vec::new() } else { vec![key.audience.clone()] },
            expiration_seconds: Some(key.expiration_seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    }
}

/// A token the API issued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    pub token: String,
    pub expires_at: Timestamp,
    /// The lifetime the API granted (it may differ from the one asked for).
    pub expiration_seconds: i64,
}

impl Token {
    /// The token of an answered TokenRequest; `None` if the answer has none.
    pub fn from_response(tr: &TokenRequest, asked: &TokenKey) -> Option<Token> {
        let status = tr.status.as_ref().filter(|s| !s.token.is_empty())?;
        Some(Token {
            token: status.token.clone(),
            expires_at: status.expiration_timestamp.0,
            expiration_seconds: tr.spec.expiration_seconds.unwrap_or(asked.expiration_seconds),
        })
    }

    /// When it was issued: its expiry less its lifetime.
    fn issued_at(&self) -> Timestamp {
        self.expires_at - jiff::SignedDuration::from_secs(self.expiration_seconds)
    }

    /// The instant from which the token is replaced: 80% of its lifetime or [`MAX_TTL`] after
    /// its issue, whichever comes first, less `jitter`.
    pub fn refresh_at(&self, jitter: Duration) -> Timestamp {
        let jitter = jiff::SignedDuration::try_from(jitter).unwrap_or_default();
        let by_age = self.issued_at() + jiff::SignedDuration::try_from(MAX_TTL).unwrap_or_default();
        let by_ttl = self.expires_at - jiff::SignedDuration::from_secs(self.expiration_seconds * 20 / 100);
        by_age.min(by_ttl) - jitter
    }

    /// kubelet's `requiresRefresh`.
    pub fn needs_refresh(&self, now: Timestamp, jitter: Duration) -> bool {
        now > self.refresh_at(jitter)
    }

    /// Past its expiry: not to be written even when no new one can be had.
    pub fn is_expired(&self, now: Timestamp) -> bool {
        now >= self.expires_at
    }
}

/// A jitter in `[0, MAX_JITTER)` fixed per pod, so the pods of a node do not all refresh at once.
pub fn jitter(pod_uid: &str) -> Duration {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    pod_uid.hash(&mut h);
    Duration::from_millis(h.finish() % MAX_JITTER.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::TokenRequestStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn token(issued: i64, seconds: i64) -> Token {
        Token { token: "t".into(), expires_at: at(issued + seconds), expiration_seconds: seconds }
    }

    #[test]
    fn a_token_is_replaced_once_eighty_percent_of_its_lifetime_has_passed() {
        let t = token(1_000_000, 3607);
        let due = 1_000_000 + 3607 - 3607 * 20 / 100;
        assert_eq!(t.refresh_at(Duration::ZERO), at(due));
        assert!(!t.needs_refresh(at(due), Duration::ZERO));
        assert!(t.needs_refresh(at(due + 1), Duration::ZERO));
        assert!(t.needs_refresh(at(due - 5), Duration::from_secs(10)), "the jitter brings it forward");
        assert!(!t.is_expired(at(1_000_000 + 3606)) && t.is_expired(at(1_000_000 + 3607)));
    }

    #[test]
    fn a_long_lived_token_is_replaced_after_a_day() {
        let year = 365 * 24 * 3600;
        let t = token(1_000_000, year);
        assert_eq!(t.refresh_at(Duration::ZERO), at(1_000_000 + 24 * 3600));
        assert!(t.needs_refresh(at(1_000_000 + 24 * 3600 + 1), Duration::ZERO));
    }

    #[test]
    fn jitters_stay_below_ten_seconds_and_are_fixed_per_pod() {
        assert!(jitter("a") < MAX_JITTER && jitter("b") < MAX_JITTER);
        assert_eq!(jitter("a"), jitter("a"));
    }

    fn pod_with(sources: Vec<core::VolumeProjection>) -> core::Pod {
        core::Pod {
            metadata: ObjectMeta { name: Some("web".into()), uid: Some("u-1".into()), ..Default::default() },
            spec: Some(core::PodSpec {
                volumes: Some(vec![core::Volume {
                    name: "kube-api-access-abcde".into(),
                    projected: Some(core::ProjectedVolumeSource { sources: Some(sources), default_mode: None }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn token_source(audience: Option<&str>, seconds: Option<i64>) -> core::VolumeProjection {
        core::VolumeProjection {
            service_account_token: Some(core::ServiceAccountTokenProjection {
                audience: audience.map(String::from),
                expiration_seconds: seconds,
                path: "token".into(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_request_is_kubelets_bound_to_the_pod_with_the_sources_audience() {
        let pod = pod_with(vec![token_source(None, Some(3607)), token_source(Some("vault"), None)]);
        let keys: Vec<TokenKey> = referenced(pod.spec.as_ref().unwrap()).into_iter().collect();
        assert_eq!(
            keys,
            [
                TokenKey { audience: String::new(), expiration_seconds: 3607 },
                TokenKey { audience: "vault".into(), expiration_seconds: 3600 },
            ]
        );
        let api = request(&pod, &keys[0]);
        assert!(api.spec.audiences.is_empty(), "no audience: the API's own");
        assert_eq!(api.spec.expiration_seconds, Some(3607));
        let bound = api.spec.bound_object_ref.unwrap();
        assert_eq!(
            (bound.api_version.as_deref(), bound.kind.as_deref(), bound.name.as_deref(), bound.uid.as_deref()),
            (Some("v1"), Some("Pod"), Some("web"), Some("u-1"))
        );
        assert_eq!(request(&pod, &keys[1]).spec.audiences, ["vault"]);
        assert_eq!(service_account(&pod), "default");
    }

    #[test]
    fn the_answer_gives_the_token_and_the_granted_lifetime() {
        let key = TokenKey { audience: String::new(), expiration_seconds: 3607 };
        let mut tr = request(&pod_with(vec![]), &key);
        assert_eq!(Token::from_response(&tr, &key), None);
        tr.spec.expiration_seconds = Some(7200);
        tr.status = Some(TokenRequestStatus { token: "jwt".into(), expiration_timestamp: Time(at(9_000)) });
        assert_eq!(
            Token::from_response(&tr, &key),
            Some(Token { token: "jwt".into(), expires_at: at(9_000), expiration_seconds: 7200 })
        );
    }
}
